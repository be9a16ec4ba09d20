"""Benchmarks (not tests): run them by hand, e.g. `python bench/gateway_capacity.py --table`."""
