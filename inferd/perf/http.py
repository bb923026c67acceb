"""``inferd perf -i http``: the KServe v2 REST protocol, as perf_analyzer's ``-i http`` speaks it.

The control calls (health, metadata, config, statistics) go over ``urllib`` from the
controlling process; the requests are built once here (a JSON header followed by the tensors
as binary data, Triton's binary tensor extension, outputs asked for as binary too) and the
workers POST them with aiohttp, one keep-alive connection per request in flight, as
perf_analyzer's one curl handle per context does.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

from .inputs import DURATIONS, STAT_FIELDS, InputInfo, ModelInfo, Placement, raw_bytes
from .options import PerfError, PerfOptions, TlsOptions

HEADER_LENGTH = "Inference-Header-Content-Length"
def model_path(name: str, version: str) -> str:
    path = f"/v2/models/{urllib.parse.quote(name, safe='')}"
    return path + (f"/versions/{urllib.parse.quote(version, safe='')}" if version else "")


class HttpServerClient:
    """The control calls over HTTP (same surface as model.ServerClient)."""

    def __init__(self, url: str, timeout: float, tls: TlsOptions | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        from .transport import http_base, https_context

        self.url = url
        self.base = http_base(url, tls)
        self.timeout = timeout
        self.context = https_context(tls) if tls is not None else None
        self.headers = dict(headers or ())

    def close(self) -> None:
        """Nothing held: each call opens its own connection."""

    def _get(self, path: str, what: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers,
                                         method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise PerfError(f"{what} failed on {self.url}: HTTP {exc.code}: {_error_text(detail)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PerfError(f"cannot reach an HTTP inference server at {self.url}: {reason}") from None
        return json.loads(body) if body else {}

    def register_system_region(self, name: str, key: str, byte_size: int) -> None:
        self._get(f"/v2/systemsharedmemory/region/{urllib.parse.quote(name, safe='')}/register",
                  f"registering system shared memory region '{name}'", {"key": key, "offset": 0, "byte_size": byte_size})

    def unregister_system_region(self, name: str) -> None:
        self._get(f"/v2/systemsharedmemory/region/{urllib.parse.quote(name, safe='')}/unregister",
                  f"unregistering system shared memory region '{name}'", {})

    def register_cuda_region(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        import base64

        self._get(f"/v2/cudasharedmemory/region/{urllib.parse.quote(name, safe='')}/register",
                  f"registering CUDA shared memory region '{name}'",
                  {"raw_handle": {"b64": base64.b64encode(raw_handle).decode()}, "device_id": device_id,
                   "byte_size": byte_size})

    def unregister_cuda_region(self, name: str) -> None:
        self._get(f"/v2/cudasharedmemory/region/{urllib.parse.quote(name, safe='')}/unregister",
                  f"unregistering CUDA shared memory region '{name}'", {})

    def check_live(self) -> None:
        self._get("/v2/health/live", "GET /v2/health/live")

    def model_info(self, name: str, version: str) -> ModelInfo:
        where = f"model '{name}'" + (f" version {version}" if version else "")
        md = self._get(model_path(name, version), f"metadata of {where}")
        cfg = self._get(model_path(name, version) + "/config", f"config of {where}")
        max_batch = int(cfg.get("max_batch_size", 0))
        config_dims = {t["name"]: tuple(int(d) for d in t.get("dims", ())) for t in cfg.get("input", ())}
        inputs = []
        for t in md.get("inputs", ()):
            dims = config_dims.get(t["name"])
            if dims is None:
                shape = tuple(int(d) for d in t.get("shape", ()))
                dims = shape[1:] if max_batch > 0 and shape else shape
            inputs.append(InputInfo(t["name"], t["datatype"], dims))
        if not inputs:
            raise PerfError(f"{where} on {self.url} has no inputs")
        return ModelInfo(name=name, version=version, versions=[str(v) for v in md.get("versions", ())],
                         platform=md.get("platform") or cfg.get("backend", ""), max_batch_size=max_batch,
                         inputs=inputs, outputs=[t["name"] for t in md.get("outputs", ())],
                         sequence="sequence_batching" in cfg)

    def statistics(self, name: str, version: str) -> dict[str, int]:
        doc = self._get(model_path(name, version) + "/stats", f"statistics of model '{name}'")
        total = dict.fromkeys(STAT_FIELDS, 0)
        for ms in doc.get("model_stats", ()):
            if ms.get("name") != name:
                continue
            total["inference_count"] += int(ms.get("inference_count", 0))
            total["execution_count"] += int(ms.get("execution_count", 0))
            st = ms.get("inference_stats", {})
            for key in DURATIONS:
                d = st.get(key, {})
                total[f"{key}_count"] += int(d.get("count", 0))
                total[f"{key}_ns"] += int(d.get("ns", 0))
        return total


def _error_text(body: str) -> str:
    try:
        return str(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        return body


def serialize_requests(model: ModelInfo, steps: list[dict[str, np.ndarray]], options: PerfOptions,
                       placements: list[Placement] | None = None) -> list[tuple[bytes, int]]:
    """(body, JSON header length) per request, built once: the JSON header, then each input's
    bytes in order (the length goes in the Inference-Header-Content-Length header)."""
    datatype = {i.name: i.datatype for i in model.inputs}
    out = []
    for n, step in enumerate(steps):
        if placements is not None:
            out.append(_shm_request(model, step, options, placements[n]))
            continue
        raws = [raw_bytes(array, datatype[name]) for name, array in step.items()]
        parameters: dict[str, Any] = {"binary_data_output": True}
        if options.priority is not None:
            parameters["priority"] = options.priority
        if options.timeout_us is not None:
            parameters["timeout"] = options.timeout_us
        header = json.dumps({
            "inputs": [{"name": name, "shape": [int(d) for d in array.shape], "datatype": datatype[name],
                        "parameters": {"binary_data_size": len(raw)}}
                       for (name, array), raw in zip(step.items(), raws)],
            "parameters": parameters,
        }, separators=(",", ":")).encode()
        out.append((header + b"".join(raws), len(header)))
    return out


def _shm_request(model: ModelInfo, step: dict[str, np.ndarray], options: PerfOptions,
                 placement: Placement) -> tuple[bytes, int]:
    """A JSON-only request whose tensors are named by shared memory region."""
    datatype = {i.name: i.datatype for i in model.inputs}

    def where(region: str, size: int, offset: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": size}
        if offset:
            out["shared_memory_offset"] = offset
        return out

    parameters: dict[str, Any] = {}
    if options.priority is not None:
        parameters["priority"] = options.priority
    if options.timeout_us is not None:
        parameters["timeout"] = options.timeout_us
    header = json.dumps({
        "inputs": [{"name": name, "shape": [int(d) for d in array.shape], "datatype": datatype[name],
                    "parameters": where(placement.inputs[name][0], placement.inputs[name][2],
                                        placement.inputs[name][1])}
                   for name, array in step.items()],
        "outputs": [{"name": name, "parameters": where(region, size)}
                    for name, (region, size) in placement.outputs.items()],
        "parameters": parameters,
    }, separators=(",", ":")).encode()
    return header, len(header)
