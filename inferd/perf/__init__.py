"""``inferd perf``: a perf_analyzer-style load client for KServe v2 / Triton servers (gRPC and HTTP).

Layout (each imports only those above it in this list):

* ``options.py``  the command line: parser (``add_parser``), range / shape syntax, ``PerfOptions``
* ``inputs.py``   ModelMetadata + ModelConfig -> input shapes and data -> pre-serialized
                  ModelInferRequest bytes; ModelStatistics snapshots
* ``http.py``     the same for ``-i http`` (control calls over urllib, request bodies)
* ``transport.py`` how a worker sends one request per protocol (unary, streaming, TLS, headers)
* ``worker.py``   one load-generating process: closed loop (concurrency) or open loop (rate)
* ``windows.py``  request records -> window statistics (exact percentiles), stability, server deltas
* ``results.py``  ``LevelResult`` / ``RunResult``: what a run measured
* ``runner.py``   spawns the workers, drives measurement windows per load level: ``measure()``
* ``report.py``   terminal table, perf_analyzer CSV, JSON, matplotlib plot (lazy import)
* ``main.py``     the program: options -> measure -> report

The API for measuring from code (``inferd tune``)::

    from inferd.perf import measure, parse_options
    result = measure(parse_options(["-m", "mlp", "-u", "127.0.0.1:8001", "--concurrency-range", "4", "-q"]))
    result.levels[0].throughput, result.levels[0].client.latency_us["p99"]

``measure`` raises :class:`PerfError` for anything the user has to fix. Only grpcio,
protobuf and numpy are needed; ``-i http`` needs aiohttp, ``--plot`` matplotlib.
"""

from __future__ import annotations

from typing import Any

from .options import PerfError, PerfOptions, add_parser, parse_options

# The runner pulls in grpc, numpy and multiprocessing; the CLI imports this package for its
# parser on every ``inferd`` command, so those load when first used.
_LAZY = {"measure": ".runner", "run": ".main", "LevelResult": ".results", "RunResult": ".results"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["LevelResult", "PerfError", "PerfOptions", "RunResult", "add_parser", "measure", "parse_options", "run"]
