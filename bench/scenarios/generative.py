"""Generative and offline work. (1) tokens/s of the example generator (a two-layer GRU over bytes, Python + torch, one byte per step; hidden 256 as in the example repository, and 768, where a step's compute outweighs serving its tokens) with continuous batching (sequence_batching.iterative_sequence: rows join and leave between steps) against request-level batching (dynamic_batching: a batch runs until its longest request ends) and no batching, at 32 concurrent gRPC streams (tritonclient.grpc.aio, closed loop), with generation lengths (max_tokens) drawn from a long-tailed distribution; the same lengths, in the same order, for each. The client is raw grpc.aio with tritonclient's messages, in one process; the same runs again in-process (the streams in the benchmark's own process through the model path, no gRPC: the scheduling without the transport's cost, and one process fewer on the cores). (2) A batch job's rows/s (POST /v2/batches, mlp, one row a line) against the raw onnxruntime ceiling at batch 1 and 64. The client, the server and other engineers' work share the machine's 2 cores."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.bench import OUT, Measure, bench_repository, raw_ceiling, start_inferd

INTERPRETATION = (" What continuous batching saves is the compute of rows that are done (static request-level batching pads them to the batch's longest member) and the wait for that member before a stream's next request joins; it costs a state hand-back per row and step. At hidden 256 a 32-row GRU step (~2 ms) is small next to serving its 32 tokens in Python (~0.1-0.2 ms each, on the same GIL), so the saving is a small share and the noise of the shared machine decides the wall-clock ratio; at hidden 768 the step's compute is most of the cost and continuous batching's lead shows in both tokens/s and CPU per token.")
NEEDS_PERF_ANALYZER = False  # its own clients: tritonclient's streams, the batch API
STREAMS = 32
MODES = (("continuous", "continuous batching (iterative_sequence)"),
         ("request", "request-level batching (dynamic_batching, static: padded to the longest)"),
         ("request_compact", "request-level batching, finished rows leave the computation"),
         ("none", "no batching"))


# The example generator (hidden 256: a step's compute is small next to serving each token), and
# one whose step is heavier (hidden 768: the step's compute dominates, as in larger models).
SIZES = (256, 768)


def model_name(hidden: int, mode: str) -> str:
    return f"gen{hidden}_{mode}"


def model_label(hidden: int, label: str) -> str:
    return f"{label}, hidden {hidden}"


def lengths(count: int, seed: int = 0) -> list[int]:
    """Long-tailed generation lengths: lognormal (median 16), cut to 4..256."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in np.clip(np.round(rng.lognormal(np.log(16), 1.0, count)), 4, 256)]


def repository() -> Path:
    from inferd.examples import generator_assets as g
    from inferd.examples.build import ModelSpec, build_repository
    from inferd.examples.python_models import source

    repo = OUT / "generative_repo"

    def weights(hidden: int):  # type: ignore[no-untyped-def]
        return lambda: g.weights(hidden=hidden)

    specs = [ModelSpec(model_name(h, mode), g.config(model_name(h, mode), batching=mode, hidden=h),
                       {"1/model.py": source("generator"), "1/weights.npz": weights(h)})
             for h in SIZES for mode, _ in MODES]
    build_repository(repo, models=specs, log=None)
    return repo


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(model: str, max_tokens: int) -> object:
    """A ModelStreamInfer request (tritonclient's messages): prompt b"inferd", ``max_tokens``, and the
    empty final response (tritonclient.grpc.aio cannot ask for it: the parameter is reserved there)."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    prompt = request.inputs.add(name="PROMPT", datatype="BYTES", shape=[1, 1])
    del prompt  # the data travels in raw_input_contents
    text = b"inferd"
    request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


async def drive(url: str, model: str, plan: list[int]) -> tuple[int, float, list[float]]:
    """``STREAMS`` closed-loop gRPC streams share ``plan`` (max_tokens per request); tokens, seconds, latencies."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.aio.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    work = list(plan)
    tokens = 0
    latencies: list[float] = []

    async def stream() -> None:
        nonlocal tokens
        call = stub.ModelStreamInfer()
        while work:
            n = work.pop()
            t0 = time.perf_counter()
            await call.write(_request(model, n))
            while True:
                response = await call.read()
                if response.error_message:
                    raise RuntimeError(f"{model}: {response.error_message}")
                infer = response.infer_response
                if infer.outputs:
                    tokens += 1
                if infer.parameters["triton_final_response"].bool_param:
                    break
            latencies.append((time.perf_counter() - t0) * 1e6)
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF

    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(STREAMS)))
    elapsed = time.perf_counter() - t0
    await channel.close()
    return tokens, elapsed, latencies


async def drive_in_process(manager, model: str, plan: list[int]) -> tuple[int, float, list[float]]:  # type: ignore[no-untyped-def]
    """As :func:`drive`, with the streams in this process (the model path's ``infer_stream``, no gRPC)."""
    from inferd.clock import MonotonicClock
    from inferd.model import infer_stream
    from inferd.types import InferenceRequest

    clock = MonotonicClock()
    work = list(plan)
    tokens = 0
    latencies: list[float] = []

    async def stream() -> None:
        nonlocal tokens
        while work:
            n = work.pop()
            t0 = time.perf_counter()
            request = InferenceRequest(model, {"PROMPT": np.array([[b"inferd"]], dtype=np.object_)},
                                       parameters={"max_tokens": n})
            async for item in infer_stream(manager.get, request, clock):
                if item.error is not None:
                    raise item.error
                if item.response is not None:
                    tokens += 1
            latencies.append((time.perf_counter() - t0) * 1e6)

    t0 = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(STREAMS)))
    return tokens, time.perf_counter() - t0, latencies


def rotated(r: int) -> tuple[tuple[str, str], ...]:
    """The modes in round ``r``'s order: a drift in the machine's load hits each alike."""
    return MODES[r % len(MODES):] + MODES[:r % len(MODES)]


def measure_in_process(repo: Path, rounds: int, plan: list[int]) -> dict[str, list[dict]]:
    """Every mode of every size, ``rounds`` times (rotated), with the models and the streams in this process."""
    from inferd.repository import ModelManager

    async def measure() -> dict[str, list[dict]]:
        manager = ModelManager([repo], mode="explicit",
                               startup_models=[model_name(h, m) for h in SIZES for m, _ in MODES])
        await manager.load_all()
        found: dict[str, list[dict]] = {}
        try:
            for r in range(rounds):
                for h in SIZES:
                    for mode, label in rotated(r):
                        name = model_name(h, mode)
                        await drive_in_process(manager, name, [8] * STREAMS)  # warm-up
                        cpu0 = cpu_seconds(os.getpid())
                        tokens, seconds, latencies = await drive_in_process(manager, name, plan)
                        cpu = cpu_seconds(os.getpid()) - cpu0
                        m = Measure(f"{model_label(h, label)}, in-process", STREAMS, 1, tokens / seconds,
                                    float(np.percentile(latencies, 50)), float(np.percentile(latencies, 99)),
                                    rows_per_s=tokens / seconds,
                                    note=f"{tokens} tokens in {seconds:.1f} s; CPU {cpu / tokens * 1e6:.0f} us/token")
                        found.setdefault(m.label, []).append(dict(m.__dict__, cpu_us_per_token=cpu / tokens * 1e6))
        finally:
            await manager.stop()
        return found

    return asyncio.run(measure())


def median_round(rounds: list[dict]) -> dict:
    """The round with the median tokens/s, noting every round's figure."""
    best = sorted(rounds, key=lambda m: m["infer_per_s"])[len(rounds) // 2]
    return dict(best, note=best["note"] + "; tokens/s by round: " + ", ".join(f"{m['infer_per_s']:.0f}" for m in rounds))


def measure_generation(url: str, pid: int, label: str, model: str, plan: list[int]) -> dict:
    asyncio.run(drive(url, model, [8] * STREAMS))  # warm-up: torch's first calls, the streams' channels
    cpu0 = cpu_seconds(pid)
    tokens, seconds, latencies = asyncio.run(drive(url, model, plan))
    cpu = cpu_seconds(pid) - cpu0
    return dict(Measure(label, STREAMS, 1, tokens / seconds, float(np.percentile(latencies, 50)),
                        float(np.percentile(latencies, 99)), rows_per_s=tokens / seconds,
                        note=f"{tokens} tokens in {seconds:.1f} s; server CPU {cpu / tokens * 1e6:.0f} us/token"
                        ).__dict__, cpu_us_per_token=cpu / tokens * 1e6)


def mlp_lines(n: int) -> bytes:
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((n, 256)).astype(np.float32).round(3)
    return "".join(json.dumps({"custom_id": f"r{i}", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "data": rows[i].tolist()}]}) + "\n"
        for i in range(n)).encode()


def measure_batch_job(http: str, pid: int, n: int) -> Measure:
    base = f"http://{http}/v2/batches"
    data = mlp_lines(n)
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(f"{base}?model=mlp", data=data, method="POST")) as r:
        job = json.loads(r.read())
    while True:
        with urllib.request.urlopen(f"{base}/{job['id']}") as r:
            doc = json.loads(r.read())
        if doc["status"] != "running" and doc["status"] != "queued":
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    rate = doc["request_counts"]["succeeded"] / seconds
    return Measure("batch job (mlp, 1 row a line, POST /v2/batches)", 1, 1, rate, 0.0, 0.0, rows_per_s=rate,
                   note=f"{n} lines, {doc['status']} in {seconds:.1f} s (submit to done, JSON in and out); "
                        f"server CPU {cpu / n * 1e6:.0f} us/row")


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def run(quick: bool) -> dict:
    plan = lengths(64 if quick else 160)
    rounds = 2 if quick else 3
    gen_repo = repository()
    out: dict = {"measures": [], "ceilings": {}, "rounds": {}, "lengths": {
        "count": len(plan), "mean": float(np.mean(plan)), "median": float(np.median(plan)), "max": max(plan)}}
    loads = [loadavg()]
    server, url = start_inferd(gen_repo)
    try:
        # Rounds, each mode once a round in a rotated order: the machine's load (other engineers'
        # work) drifts, and a drift then hits every mode alike; the medians are reported.
        for r in range(rounds):
            for h in SIZES:
                for mode, label in rotated(r):
                    m = measure_generation(url, server.proc.pid, model_label(h, label), model_name(h, mode), plan)
                    out["rounds"].setdefault(m["label"], []).append(m)
            loads.append(loadavg())
    finally:
        server.stop()
    out["rounds"].update(measure_in_process(gen_repo, rounds, plan))
    loads.append(loadavg())
    for label in out["rounds"]:
        out["measures"].append(median_round(out["rounds"][label]))
    mlp_repo = bench_repository(big=False)
    from bench.bench import free_port

    http_port = free_port()
    server, _ = start_inferd(mlp_repo, http_port=http_port)
    try:
        out["measures"].append(measure_batch_job(f"127.0.0.1:{http_port}", server.proc.pid,
                                                 1000 if quick else 4000).__dict__)
    finally:
        server.stop()
    model = mlp_repo / "mlp" / "1" / "model.onnx"
    for batch in (1, 64):
        feeds = {"INPUT0": np.zeros((batch, 256), np.float32)}
        out["ceilings"][f"raw onnxruntime rows/s, mlp batch {batch}"] = raw_ceiling(model, feeds) * batch
    out["notes"] = (f"Generation lengths: {len(plan)} requests, mean {np.mean(plan):.1f}, median "
                    f"{np.median(plan):.0f}, max {max(plan)} tokens (lognormal, cut to 4..256). infer/s is "
                    f"tokens/s (the median of {rounds} rounds, each mode once a round); p50/p99 are whole-request "
                    "latencies. The machine (2 cores) was shared with other engineers' builds, tests and "
                    f"benchmarks while this ran: load average {', '.join(loads)} (start, after each round). "
                    "Server CPU per token (from /proc) is the steadier figure; the tokens/s ratios, taken in one "
                    "run, are what to compare." + INTERPRETATION)
    return out


def ratios(result: dict) -> dict:
    by = {m["label"]: m for m in result["measures"]}
    job = next((m for m in result["measures"] if m["label"].startswith("batch job")), None)
    out = {}
    for h in SIZES:
        for where, suffix in (("over gRPC", ""), ("in-process", ", in-process")):
            cont, req, compact, none = (by.get(model_label(h, label) + suffix) for _, label in MODES)
            if not cont:
                continue
            for name, other, target in (("request-level batching (static)", req, " (target >= 2x)"),
                                        ("request-level batching (compact)", compact, ""),
                                        ("no batching", none, "")):
                if other and other["infer_per_s"]:
                    cpu = ""
                    if cont.get("cpu_us_per_token") and other.get("cpu_us_per_token"):
                        cpu = (f"; CPU per token {other['cpu_us_per_token'] / cont['cpu_us_per_token']:.2f}x "
                               "as much without continuous batching")
                    out[f"hidden {h}, {where}: continuous / {name}, tokens/s"] = (
                        f"{cont['infer_per_s'] / other['infer_per_s']:.2f}x{target}{cpu}")
    if job:
        for key, ceiling in result["ceilings"].items():
            out[f"batch job rows/s / {key}"] = f"{job['rows_per_s'] / ceiling:.3f}x"
    return out
