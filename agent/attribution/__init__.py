"""Workload attribution sources: which pod or HPC job each GPU serves (issue 18)."""
