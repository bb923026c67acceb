"""Benchmark scripts (run with ``make bench``); results in bench/RESULTS.md."""
