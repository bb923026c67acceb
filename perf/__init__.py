"""Benchmark scripts (run with ``make bench``); results in perf/RESULTS.md."""
