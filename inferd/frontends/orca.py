"""The ORCA load report on HTTP generate and generate_stream (Triton's orca_http, server #7839).

A request header ``endpoint-load-metrics-format: json`` (or ``text``) asks for the response header
``endpoint-load-metrics``, which a load balancer (Envoy's ORCA, the Gateway API inference extension)
reads to route by the model server's KV-cache load. Its named metrics are computed as Triton computes
them from the KV-cache block metrics a model registered (``nv_trt_llm_kv_cache_block_metrics`` gauges,
``kv_cache_block_type`` ``tokens_per``, ``used`` and ``max``: :meth:`DataPlaneAPI.kv_cache_blocks`):

- ``kv_cache_utilization`` = used / max (0 when max is 0),
- ``max_token_capacity`` = max x tokens_per, as an unsigned integer.

``JSON {"named_metrics":{...}}`` or ``TEXT named_metrics.k=v, ...``; no header when the request does
not ask, asks for another format, or a block metric is missing (as Triton, which logs it).
"""

from __future__ import annotations

import json
import logging
import re

log = logging.getLogger(__name__)

REQUEST_HEADER = "endpoint-load-metrics-format"
RESPONSE_HEADER = "endpoint-load-metrics"
FORMATS = ("json", "text")


def load_metrics(blocks: dict[str, float]) -> tuple[float, int] | None:
    """(kv_cache_utilization, max_token_capacity) from the block metrics, or None when one is missing."""
    tokens_per, used, most = (blocks.get(k, -1.0) for k in ("tokens_per", "used", "max"))
    if tokens_per < 0 or used < 0 or most < 0:
        return None
    return (used / most if most > 0 else 0.0), int(most * tokens_per)


def _double(value: float) -> str:
    """A double as rapidjson writes one (the shortest form that reads back, ``1e-5`` not Python's ``1e-05``)."""
    return re.sub(r"e(-?)0*(\d)", r"e\1\2", json.dumps(value))


def header_value(fmt: str, blocks: dict[str, float]) -> str | None:
    """The ``endpoint-load-metrics`` value for a request's ``fmt``, or None (no header)."""
    if fmt not in FORMATS:
        log.error("%s is set to an invalid type: %s (use json or text); no load report written", REQUEST_HEADER, fmt)
        return None
    metrics = load_metrics(blocks)
    if metrics is None:
        log.error("%s is set but the KV-cache block metrics (nv_trt_llm_kv_cache_block_metrics: tokens_per, used, "
                  "max) are not all registered; no load report written", REQUEST_HEADER)
        return None
    utilization, capacity = metrics
    if fmt == "json":
        return (f'JSON {{"named_metrics":{{"kv_cache_utilization":{_double(utilization)},'
                f'"max_token_capacity":{capacity}}}}}')
    return f"TEXT named_metrics.kv_cache_utilization={utilization:f}, named_metrics.max_token_capacity={capacity}"
