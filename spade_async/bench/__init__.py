"""Benchmarks behind `spade bench ...`: each prints figures measured side by side in one run."""
