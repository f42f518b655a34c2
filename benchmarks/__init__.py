"""Benchmarks: `python -m benchmarks list` names the scenarios, `python -m benchmarks NAME` runs one."""
