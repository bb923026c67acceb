"""Deterministic per-request counts of the request path in one process, with no network.

    python -m bench.request_counts [--requests 400] [--concurrency 1 16] [--json]

A real DataPlane (identity_fp32 from the example repository, ``dynamic_batching {}``) behind the
real gRPC servicer (``InferenceServicer.ModelInfer``), handed protobuf requests as grpc.aio would
hand them, with a context that only answers what ModelInfer asks; the bare echo servicer
(bench/echo_server.py) is driven the same way, and so are two more models of the same data plane
(issue 30): "ensemble", ensemble_mlp (scale -> mlp -> relu, three batching ONNX models), and
"fused", mlp_fused (the same computation as one model). "handoff" is the default process mode's path in
one process: the servicer a frontend worker runs (over RemoteDataPlane and its CoreLink), the hand-off's
channel over a real unix socket pair, and the core's DataPlaneEndpoint over the same DataPlane, both ends
on this loop, so its counts are the worker's and the core's together. "stream" is the same servicer's
ModelStreamInfer, every request on one stream (as perf_analyzer --streaming sends them), each answered
in turn. Their counts include the runtime's calls, and which of its batches run on the loop or on an
instance thread follows the executions' measured times, so they are exact only for one such choice.
Counted over ``--requests`` requests after a warm-up, ``--concurrency`` of them started together in one
loop turn (as one socket read brings them):

- ``python_calls``: Python function calls (``sys.setprofile`` 'call' events, every thread; a
  generator's or coroutine's resumption counts as a call), ``inferd_calls`` those of inferd's own
  code (tests/test_request_counts.py pins them);
- ``c_calls``: calls of C functions from Python ('c_call' events);
- ``loop_turns``: event-loop iterations (``BaseEventLoop._run_once``);
- ``gc_objects``: container objects created (the collector's generation-0 count, with collections
  counted through ``gc.callbacks``, over a run with the collector's threshold raised so none runs);
- ``kept_blocks``/``kept_bytes``: memory blocks still allocated after the run, divided by the
  requests (tracemalloc, over a second run compared with the first, so the last batch's few
  objects, held until the next batch replaces them, cancel out): what outlives its request. The
  smaller of two such comparisons (runs 1 to 2 and 2 to 3): a leak grows in both, while what the
  runtime keeps in pools whose size follows the timing (ONNX Runtime's outputs, up to ~90 blocks
  under machine load, none when quiet) shows in one at most.

These are exact for one code path and input (no clock, no machine load in them), so a change that
removes work shows here as a smaller number; the served figures (CPU per inference from /proc,
syscalls, context switches) are the ``request_cpu`` scenario's (bench/scenarios/request_cpu.py).
Run under ``valgrind --tool=callgrind`` for instruction counts (the scenario does, when valgrind is
installed: ``--only`` picks one path and phase).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import threading
import tracemalloc
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

import inferd

from inferd._proto import grpc_service_pb2 as pb

MODEL = "identity_fp32"
# The ensemble these counts also drive (issue 30): scale -> mlp -> relu, three batching ONNX models, and
# mlp_fused, the same computation as one model; FP32 [1, 256] in.
ENSEMBLE, FUSED = "ensemble_mlp", "mlp_fused"
ENSEMBLE_MODELS = ("ens_scale", "ens_mlp", "ens_relu", ENSEMBLE, FUSED)


class _Context:
    """What ModelInfer asks of a grpc.aio ServicerContext on its success path."""

    def time_remaining(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    def invocation_metadata(self) -> tuple:
        return ()

    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"the request failed: {code} {details}")

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


def infer_request(rid: int = 0, model: str = MODEL) -> Any:
    """One ModelInferRequest: identity_fp32's 16 floats, or the ensemble's (and the fused model's) 256."""
    size = 16 if model == MODEL else 256
    request = pb.ModelInferRequest(model_name=model, id=str(rid))
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, size])
    request.raw_input_contents.append(np.arange(size, dtype=np.float32).tobytes())
    return request


Call = Callable[[Any, Any], Awaitable[Any]]
# Which model each servicer path is handed requests for.
PATH_MODELS = {"inferd": MODEL, "echo": MODEL, "ensemble": ENSEMBLE, "fused": FUSED, "handoff": MODEL, "stream": MODEL}
HANDOFF_ARENA = 64 << 20  # each of the hand-off path's arenas (sparse memfds)


async def _drive(call: Call, requests: int, concurrency: int, model: str = MODEL) -> None:
    context = _Context()
    message = infer_request(model=model)
    for _ in range(requests // concurrency):
        replies = await asyncio.gather(*(call(message, context) for _ in range(concurrency)))
        if len(replies[0].raw_output_contents) != 1:
            raise RuntimeError(f"unexpected reply: {replies[0]}")


INFERD_DIR = str(Path(inferd.__file__).parent)


class _Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.ours = 0
        self.c_calls = 0
        self.turns = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            code = frame.f_code
            if code.co_filename.startswith(INFERD_DIR):
                self.ours += 1
            elif code.co_name == "_run_once":
                self.turns += 1
        elif event == "c_call":
            self.c_calls += 1


def never_shed() -> Any:
    """The shedding controller a server runs by default (so its per-request work is counted), with a
    target no delay reaches: on a shared machine a descheduled process would otherwise be shed."""
    from inferd.dataplane.shedding import QueueDelay

    return QueueDelay(target_us=3_600_000_000)


def repository(folder: Path, ensemble: bool = False) -> Path:
    """The model these counts drive, identity_fp32 (16 floats, dynamic_batching {}), built in ``folder``;
    ``ensemble``: and ensemble_mlp, its three models and mlp_fused."""
    from inferd.examples import build as b

    names = {MODEL, *ENSEMBLE_MODELS} if ensemble else {MODEL}
    b.build_repository(folder, models=[s for s in b.MODELS if s.name in names], log=None)
    return folder


async def servicers(repo: Path | None = None) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    """inferd's ModelInfer over a loaded DataPlane (``repo``: the benchmark repository by default)
    and the echo's; and the coroutine function that closes the data plane. Where the repository
    holds ensemble_mlp, "ensemble" and "fused" are inferd's ModelInfer too, to be driven with
    requests for it and for mlp_fused (:data:`PATH_MODELS`)."""
    from bench.bench import bench_repository
    from bench.echo_server import EchoServicer
    from inferd.dataplane import DataPlane
    from inferd.repository import ModelManager
    from inferd.frontends.grpc_service import InferenceServicer

    folder = repo or bench_repository(big=False)
    dp = DataPlane(ModelManager([folder]), shedding=never_shed())
    await dp.load_models()
    infer = InferenceServicer(dp).ModelInfer
    calls: dict[str, Call] = {"inferd": infer, "echo": EchoServicer().ModelInfer}
    if (folder / ENSEMBLE).is_dir():
        calls.update(ensemble=infer, fused=infer)
    calls["handoff"], close_handoff = await handoff(dp)
    calls["stream"], close_stream = await stream(InferenceServicer(dp))

    async def close() -> None:
        await close_stream()
        close_handoff()
        await dp.close()

    return calls, close


async def handoff(dp: Any) -> tuple[Call, Callable[[], None]]:
    """ModelInfer as a frontend worker serves it (the servicer over RemoteDataPlane and its CoreLink), handed
    off through a real channel and arenas to the core's DataPlaneEndpoint over ``dp``, both ends on this
    loop; and the function that closes them."""
    from inferd.frontends.grpc_service import InferenceServicer
    from inferd.handoff.core.endpoint import DataPlaneEndpoint
    from inferd.handoff.messages import ToCore, ToWorker
    from inferd.handoff.worker.core_link import CoreLink
    from inferd.handoff.worker.proxy import RemoteDataPlane
    from inferd.ipc.arena import Arena, ArenaWriter
    from inferd.ipc.channel import Channel, socket_pair

    core_end, worker_end = socket_pair()
    inputs, outputs = Arena.create(HANDOFF_ARENA, "counts-inputs"), Arena.create(HANDOFF_ARENA, "counts-outputs")
    ends: dict[str, Any] = {}
    core_channel = await Channel.open(core_end, lambda msg: ends["core"].on_message(msg), "core", receives=ToCore)
    worker = SimpleNamespace(index=0, channel=core_channel, inputs=inputs, outputs=ArenaWriter(outputs))
    ends["core"] = DataPlaneEndpoint(worker, dp, lambda method, args, kwargs: None)  # type: ignore[arg-type]
    worker_channel = await Channel.open(worker_end, lambda msg: ends["worker"].on_message(msg), "worker",
                                        receives=ToWorker)
    # The worker maps the arenas through fds of its own, as a worker process does.
    ends["worker"] = link = CoreLink(worker_channel, {"inputs": [os.dup(inputs.fd), inputs.size],
                                                      "outputs": [os.dup(outputs.fd), outputs.size]})

    def close() -> None:
        worker_channel.close()
        core_channel.close()
        for arena in (link.inputs.arena, link.outputs, inputs, outputs):
            arena.close()

    return InferenceServicer(RemoteDataPlane(link)).ModelInfer, close


class _StreamContext(_Context):
    """What ModelStreamInfer asks of its context: each written message answers the oldest call waiting."""

    def __init__(self) -> None:
        self.waiting: deque[asyncio.Future] = deque()

    async def write(self, message: Any) -> None:
        answer = self.waiting.popleft()
        if message.error_message:
            answer.set_exception(RuntimeError(f"the request failed: {message.error_message}"))
        else:
            answer.set_result(message.infer_response)


async def stream(servicer: Any) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """ModelInfer's calls carried by one ModelStreamInfer stream (as perf_analyzer --streaming sends them):
    each call puts its request on the stream and awaits its answer (a model that is not decoupled is
    answered in the order its requests came); and the coroutine function that ends the stream."""
    requests: asyncio.Queue = asyncio.Queue()
    context = _StreamContext()

    async def incoming() -> Any:
        while (message := await requests.get()) is not None:
            yield message

    task = asyncio.ensure_future(servicer.ModelStreamInfer(incoming(), context))

    async def call(message: Any, _context: Any) -> Any:
        answer = asyncio.get_running_loop().create_future()
        context.waiting.append(answer)
        requests.put_nowait(message)
        return await answer

    async def close() -> None:
        requests.put_nowait(None)
        await task

    return call, close


async def count(call: Call, requests: int, concurrency: int, model: str = MODEL) -> dict[str, float]:
    """Per request, the counts above for ``requests`` requests for ``model`` through ``call``."""
    await _drive(call, 64 * concurrency, concurrency, model)  # warm: caches, lazily built objects, the probe's state
    counter = _Counter()
    threading.setprofile(counter)
    sys.setprofile(counter)
    try:
        await _drive(call, requests, concurrency, model)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    collections = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            collections[0] += 1

    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(10**9)
    gc.callbacks.append(on_gc)
    before = gc.get_count()[0]
    try:
        await _drive(call, requests, concurrency, model)
        created = gc.get_count()[0] - before
    finally:
        gc.callbacks.remove(on_gc)
        gc.set_threshold(*threshold)
    if collections[0]:
        raise RuntimeError("a collection ran during the count: raise the threshold")

    # Runs under tracing, each compared with the one before: what the first leaves (the last batch's
    # objects, caches filled once) is in both snapshots, so only what grows with the requests remains.
    tracemalloc.start()
    snapshots = []
    for _ in range(3):
        await _drive(call, requests, concurrency, model)
        gc.collect()
        snapshots.append(tracemalloc.take_snapshot())
    tracemalloc.stop()
    grown = min(([s for s in later.compare_to(earlier, "filename") if s.count_diff > 0]
                 for earlier, later in zip(snapshots, snapshots[1:])),
                key=lambda diff: sum(s.count_diff for s in diff))
    n = requests // concurrency * concurrency
    return {"python_calls": counter.calls / n, "inferd_calls": counter.ours / n, "c_calls": counter.c_calls / n, "loop_turns": counter.turns / n,
            "gc_objects": created / n,  # net of the container objects freed meanwhile: young garbage is freed at once
            "kept_blocks": sum(s.count_diff for s in grown) / n, "kept_bytes": sum(s.size_diff for s in grown) / n}


async def measure(requests: int, levels: list[int], only: str | None = None,
                  plain: bool = False) -> dict[str, dict[str, dict[str, float]]]:
    """The counts for each path and concurrency; ``plain``: only drive the requests (after the
    warm-up), counting nothing, for an outside counter such as callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        calls, close = await servicers(repository(Path(tmp) / "repo", ensemble=True))
        out: dict[str, dict[str, dict[str, float]]] = {}
        try:
            for name, call in calls.items():
                if only and name != only:
                    continue
                model = PATH_MODELS[name]
                if plain:
                    for c in levels:
                        await _drive(call, 64 * c, c, model)
                        await _drive(call, requests, c, model)
                    continue
                out[name] = {f"c={c}": await count(call, requests, c, model) for c in levels}
        finally:
            await close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--only", choices=tuple(PATH_MODELS))
    parser.add_argument("--instructions", action="store_true",
                        help="count nothing: drive the requests for valgrind --tool=callgrind")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = asyncio.run(measure(args.requests, args.concurrency, args.only, args.instructions))
    if args.json:
        print(json.dumps(out))
        return
    for name, levels in out.items():
        for level, counts in levels.items():
            print(f"{name:<7} {level:<5} " + "  ".join(f"{k} {v:,.1f}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
