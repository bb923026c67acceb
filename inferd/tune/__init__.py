"""``inferd tune``: find the best configuration for a model with the load client.

    inferd tune -m MODEL --model-repository DIR [--latency-budget 20ms] [--objective throughput|latency|cost]
                [--concurrency-range 1:16:x2 | --request-rate-range ...] [--time-budget 10m] [--seed N]
                [-u HOST:PORT] [--frontend-workers 0,2] [--out DIR] [--write]

Layout: ``space.py`` (the candidates a model allows), ``search.py`` (the search, pure code over a
measuring function and a clock), ``run.py`` (real measurements: a server, config overrides at
load, :func:`inferd.perf.measure`), ``summary.py`` (table, Pareto PNG, config diff, JSON, --write),
``command.py`` (this command).
"""

from __future__ import annotations

from .command import add_parser, run

__all__ = ["add_parser", "run"]
