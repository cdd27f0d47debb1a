"""The node daemon: sources -> sampler -> publisher (+ disk spool). See README "Agent".

Modules, in the order data flows through them:

- ``sources/``: one module per input, registered by name (``base.py`` has the interface);
- ``sampler.py``: the drift-free tick clock and the frame builder;
- ``publisher.py`` + ``spool.py``: ordered, pipelined publishing; the on-disk spool;
- ``events.py``: source events -> event records; ``metrics.py``: the agent's /metrics;
- ``config.py``: settings; ``reconnect.py``: a transport that may start while the broker is
  down; ``run.py``: the daemon that wires them; ``fleet/``: the synthetic fleet model.

``agent`` imports ``schemas`` and ``fleetpulse.transport``/``fleetpulse.config`` only.
"""
