"""``inferd perf``: a perf_analyzer-style load client for KServe v2 / Triton gRPC servers.

Layout:

* ``options.py``  command-line parser (``add_parser``) and the range / shape syntax
* ``model.py``    ModelMetadata + ModelConfig -> input shapes and data -> pre-serialized
                  ModelInferRequest bytes; ModelStatistics snapshots
* ``worker.py``   one load-generating process: its own ``grpc.aio`` channel, a raw-bytes
                  unary-unary callable, closed loop (concurrency) or open loop (request rate)
* ``measure.py``  request records -> window statistics (exact percentiles over merged
                  samples), stability, server-side deltas
* ``runner.py``   spawns the workers, drives measurement windows per load level
* ``report.py``   terminal table, perf_analyzer CSV, JSON, matplotlib plot (lazy import)

Only grpcio, protobuf and numpy are needed (``inferd._proto`` stubs, not tritonclient);
``--plot`` needs matplotlib (``pip install 'inferd[perf]'``).
"""

from __future__ import annotations

from .options import add_parser, run

__all__ = ["add_parser", "run"]
