"""``inferd tune``: find the best configuration for a model with the load client, on a noisy host.

    inferd tune -m MODEL --model-repository DIR [--latency-budget 20ms] [--objective throughput|latency|cost]
                [--concurrency-range 2:16:7 | --request-rate-range ...] [--time-budget 3m] [--min-gain 10%]
                [--load-generator inferd|aiperf] [-u HOST:PORT] [--frontend-workers 0,2] [--out DIR] [--write]

Layout: ``space.py`` (the candidates a model allows, and which behave alike at a load),
``stats.py`` (the paired statistics decisions are made with), ``rounds.py`` (a round, a pair,
ratios to the current config with the host's load taken out), ``search.py`` (scan, successive
halving, the final and the decision: pure code over a measuring function and a clock),
``verify.py`` (the winner against the current config once more, before anything is written),
``host.py`` (what /proc says of a round), ``run.py`` (servers, the twin the candidates load
into, rounds with ``inferd perf``'s client), ``aiperf.py`` (rounds with NVIDIA AIPerf),
``summary.py`` (tables, verification table, plot, config diff, JSON), ``command.py`` (this command).
"""

from __future__ import annotations

from .command import add_parser, run

__all__ = ["add_parser", "run"]
