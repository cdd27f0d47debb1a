"""Random Cut Forest engines behind one batched interface (see ``base.py``)."""
