"""Test doubles. By project rule there are exactly two, for what cannot run here: the NVML
bindings fake (nvml.py) and a kubelet pod-resources server (kubelet.py)."""
