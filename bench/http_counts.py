"""What Starlette's routing and middleware cost on /v2/models/{m}/infer, against a bare ASGI path.

    python -m bench.http_counts [--requests 2000] [--json]

In one process, with no sockets: the HTTP frontend's ASGI app as a server builds it
(``HttpFrontend.app()``: the body limit middleware, ``InferRoute`` answering the infer route, Starlette
for the rest), the same app with the infer route through Starlette (its routing, Request, Response
and exception middleware: what every request took before issue 32), and a bare ASGI callable
doing the same request's own work (path split, body read, ``http_codec`` decode, ``DataPlane.infer``,
encode, the two ``send`` messages) are each handed an identity_fp32 request (16 floats, as JSON and
as binary tensor data), one after another. Per request: CPU (process time, the best of 5 rounds:
the machine is shared) and Python calls (``sys.setprofile``, exact). The difference between the two
is what the framework's per-request machinery costs; uvicorn's HTTP parsing, the same for both, is
not in either.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from bench.request_counts import MODEL

PATH = f"/v2/models/{MODEL}/infer"
X = np.arange(16, dtype=np.float32)
JSON_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                    "data": X.tolist()}]}).encode()
_HEADER = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                  "parameters": {"binary_data_size": X.nbytes}}],
                      "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
BINARY_BODY = _HEADER + X.tobytes()

App = Callable[[dict, Any, Any], Awaitable[None]]


def scope(body: bytes, binary: bool) -> dict:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/octet-stream" if binary else b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if binary:
        headers.append((b"inference-header-content-length", str(len(_HEADER)).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": PATH, "raw_path": PATH.encode(), "root_path": "", "query_string": b"", "headers": headers,
            "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}


def bare(dp: Any) -> App:
    """The infer route as a bare ASGI app: what the request itself needs, no framework."""
    from inferd.frontends import http_codec

    async def app(scope: dict, receive: Any, send: Any) -> None:
        parts = scope["path"].split("/")  # /v2/models/{m}/infer
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        length = headers.get(b"inference-header-content-length")
        decoded = http_codec.decode_infer_request(parts[3], "", b"".join(chunks),
                                                  length.decode() if length is not None else None)
        response = await dp.infer(decoded.request)
        content, header_length = http_codec.encode_infer_response(response, decoded)
        out = [(b"content-length", str(len(content)).encode()),
               (b"content-type", b"application/json" if header_length is None else b"application/octet-stream")]
        if header_length is not None:
            out.append((b"inference-header-content-length", str(header_length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": out})
        await send({"type": "http.response.body", "body": content})

    return app


async def _drive(app: App, body: bytes, binary: bool, requests: int) -> None:
    s = scope(body, binary)
    sent: list[dict] = []
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict:
        return message

    async def send(m: dict) -> None:
        sent.append(m)

    for _ in range(requests):
        await app(dict(s), receive, send)
        if sent[0].get("status") != 200:
            raise RuntimeError(f"the request failed: {sent}")
        sent.clear()


async def measure(requests: int) -> dict[str, dict[str, float]]:
    from bench.bench import bench_repository
    from bench.request_counts import never_shed
    from inferd.dataplane import DataPlane
    from inferd.repository import ModelManager
    from inferd.frontends.http_service import HttpFrontend

    dp = DataPlane(ModelManager([bench_repository(big=False)]), shedding=never_shed())
    await dp.load_models()
    from inferd.frontends.http_service import BodyLimit, InferRoute

    served = HttpFrontend(dp).app()  # BodyLimit(InferRoute(Starlette)): as a server builds it
    inner = served.app
    starlette = BodyLimit(inner.app if isinstance(inner, InferRoute) else inner, served.limit)
    apps = {"inferd's HTTP app": served, "through Starlette's route": starlette, "bare ASGI": bare(dp)}
    out: dict[str, dict[str, float]] = {}
    try:
        for kind, body, binary in (("JSON", JSON_BODY, False), ("binary", BINARY_BODY, True)):
            for name, app in apps.items():
                await _drive(app, body, binary, 200)
                best = float("inf")
                for _ in range(5):
                    t = time.process_time()
                    await _drive(app, body, binary, requests)
                    best = min(best, (time.process_time() - t) / requests * 1e6)
                calls = [0]

                def count(frame: Any, event: str, arg: Any) -> None:
                    if event == "call":
                        calls[0] += 1

                sys.setprofile(count)
                try:
                    await _drive(app, body, binary, 200)
                finally:
                    sys.setprofile(None)
                out[f"{name}, {kind}"] = {"cpu_us": round(best, 1), "python_calls": calls[0] / 200}
    finally:
        await dp.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(measure(args.requests))
    if args.json:
        print(json.dumps(out))
        return
    for name, k in out.items():
        print(f"{name:<36} {k['cpu_us']:7.1f} us CPU  {k['python_calls']:6.1f} Python calls per request")


if __name__ == "__main__":
    main()
