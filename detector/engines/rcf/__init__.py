"""Numba kernels and array state of the batched Random Cut Forest (``numba_engine``)."""
