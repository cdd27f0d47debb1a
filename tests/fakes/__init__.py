"""Test doubles. By project rule there is exactly one: the NVML bindings fake (nvml.py)."""
