"""Benchmark scenarios in their own modules; ``bench/bench.py`` finds every ``<name>.py`` here.

Each module defines ``run(quick: bool) -> dict`` (``{"measures": [...], "ceilings": {...},
"notes": "..."}``, as the scenarios in bench.py return; its docstring describes it) and may
define ``ratios(result) -> dict`` for the figures RESULTS.md shows in bold.
"""
