"""The OpenAI-compatible front (issue 27). 32 concurrent streaming chat clients (the official openai client,
AsyncOpenAI, closed loop, in one process) on the example generator (the byte GRU, continuous batching)
through /v1/chat/completions with stream: true, against the same load through ModelStreamInfer over gRPC
(raw grpc.aio with tritonclient's messages: the same prompt text, the chat template's, and the same
max_tokens per request, in the same order), and against the same chat requests run one at a time.
Per run: tokens/s, time to first token (TTFT) p50/p99 and inter-token latency p50/p99 (the gap between
two consecutive tokens of a stream, as the client sees them), and the server's CPU per token (from /proc,
core and frontend workers: bench/proc_cpu.py; one token is one row of one step, the model's
inference_count). The server runs in its default process mode (frontend workers). The clients and the
server share the machine's 2 cores, and other engineers' work shared the machine too."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.bench import OUT, free_port, start_inferd
from bench.proc_cpu import CpuMeter, statistics_count
from bench.scenarios.generative import lengths, loadavg

NEEDS_PERF_ANALYZER = False  # its own clients: the openai package and grpc.aio
STREAMS = 32
MODEL = "generator"
MESSAGES = [{"role": "user", "content": "Tell me about inferd."}]


def repository() -> Path:
    from inferd.examples.build import build_repository

    repo = OUT / "openai_repo"
    build_repository(repo, only=[MODEL], log=None)
    return repo


def chat_prompt() -> str:
    """The prompt the chat template makes of MESSAGES (what the gRPC clients send as PROMPT)."""
    from inferd.examples import text_assets

    return f"{text_assets.BOS_TOKEN}<|user|>\n{MESSAGES[0]['content']}{text_assets.EOS_TOKEN}\n<|assistant|>\n"


class Timings:
    def __init__(self) -> None:
        self.tokens = 0
        self.ttft: list[float] = []
        self.gaps: list[float] = []

    def stream(self, t0: float, stamps: list[float], tokens: int | None = None) -> None:
        self.tokens += len(stamps) if tokens is None else tokens
        if stamps:
            self.ttft.append(stamps[0] - t0)
            self.gaps.extend(np.diff(stamps).tolist())


async def drive_openai(http: str, plan: list[int], streams: int) -> tuple[Timings, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://{http}/v1", api_key="none", max_retries=0, timeout=300)
    work = list(plan)
    timings = Timings()

    async def one() -> None:
        while work:
            n = work.pop()
            t0 = time.perf_counter()
            stamps: list[float] = []
            stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=n, stream=True,
                                                          stream_options={"include_usage": True})
            tokens = 0
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    stamps.append(time.perf_counter())
                if chunk.usage is not None:  # the completion's tokens (a chunk may hold a held-back piece or none)
                    tokens = chunk.usage.completion_tokens
            timings.stream(t0, stamps, tokens)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return timings, elapsed


def _grpc_request(prompt: bytes, max_tokens: int) -> object:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="PROMPT", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(len(prompt).to_bytes(4, "little") + prompt)
    request.parameters["max_tokens"].int64_param = max_tokens
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


async def drive_grpc(url: str, plan: list[int], streams: int) -> tuple[Timings, float]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.aio.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    prompt = chat_prompt().encode()
    work = list(plan)
    timings = Timings()

    async def one() -> None:
        call = stub.ModelStreamInfer()
        while work:
            n = work.pop()
            t0 = time.perf_counter()
            stamps: list[float] = []
            await call.write(_grpc_request(prompt, n))
            while True:
                response = await call.read()
                if response.error_message:
                    raise RuntimeError(response.error_message)
                if response.infer_response.outputs:
                    stamps.append(time.perf_counter())
                if response.infer_response.parameters["triton_final_response"].bool_param:
                    break
            timings.stream(t0, stamps)
        await call.done_writing()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    elapsed = time.perf_counter() - t0
    await channel.close()
    return timings, elapsed


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1e3) if values else 0.0


def measure(label: str, run, meter: CpuMeter, streams: int) -> dict:  # type: ignore[no-untyped-def]
    before = meter.sample()
    timings, seconds = asyncio.run(run())
    cpu = meter.since(before)
    tps = timings.tokens / seconds
    return {"label": label, "concurrency": streams, "batch": 1, "infer_per_s": tps,
            "p50_us": _ms(timings.ttft, 50) * 1e3, "p99_us": _ms(timings.ttft, 99) * 1e3, "rows_per_s": tps,
            "ttft_p50_ms": _ms(timings.ttft, 50), "ttft_p99_ms": _ms(timings.ttft, 99),
            "itl_p50_ms": _ms(timings.gaps, 50), "itl_p99_ms": _ms(timings.gaps, 99),
            "cpu_us_per_token": cpu.per_inference_us(), "core_us_per_token": cpu.per_inference_us("core"),
            "note": (f"{timings.tokens} tokens in {seconds:.1f} s; TTFT p50 {_ms(timings.ttft, 50):.1f} ms, p99 "
                     f"{_ms(timings.ttft, 99):.1f} ms; inter-token p50 {_ms(timings.gaps, 50):.2f} ms, p99 "
                     f"{_ms(timings.gaps, 99):.2f} ms; server CPU {cpu.per_inference_us():.0f} us/token (core "
                     f"{cpu.per_inference_us('core'):.0f})")}


def run(quick: bool) -> dict:
    plan = lengths(64 if quick else 160, seed=27)
    repo = repository()
    http_port = free_port()
    server, url = start_inferd(repo, http_port=http_port)
    http = f"127.0.0.1:{http_port}"
    out: dict = {"measures": [], "ceilings": {}}
    loads = [loadavg()]
    try:
        urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=30).close()
        meter = CpuMeter(server.proc.pid, statistics_count(url))
        asyncio.run(drive_openai(http, [8] * STREAMS, STREAMS))  # warm-up: both paths, the model's first calls
        asyncio.run(drive_grpc(url, [8] * STREAMS, STREAMS))
        rounds = 1 if quick else 2
        for r in range(rounds):  # alternated: a drift in the machine's load hits both alike
            pair = [("openai", f"/v1/chat/completions stream, {STREAMS} openai clients",
                     lambda: drive_openai(http, plan, STREAMS)),
                    ("grpc", f"ModelStreamInfer over gRPC, {STREAMS} streams", lambda: drive_grpc(url, plan, STREAMS))]
            for _, label, go in (pair if r % 2 == 0 else pair[::-1]):
                out["measures"].append(measure(f"{label} (round {r + 1})", go, meter, STREAMS))
        single = plan[: 8 if quick else 16]
        out["measures"].append(measure("/v1/chat/completions stream, one request at a time",
                                       lambda: drive_openai(http, single, 1), meter, 1))
    finally:
        server.stop()
    loads.append(loadavg())
    out["notes"] = (f"Load average {' -> '.join(loads)} (start -> end) on the 2-core machine. "f"Generation lengths (max_tokens): {len(plan)} requests, mean {np.mean(plan):.1f}, median "
                    f"{np.median(plan):.0f}, max {max(plan)} (lognormal, cut to 4..256; the one-at-a-time run takes "
                    "the first of them). infer/s is tokens/s; p50/p99 here are time to first token. The openai "
                    "client parses each chunk with pydantic in the benchmark's process, on the same 2 cores as "
                    "the server: the server's CPU per token is the figure that isolates what /v1 costs.")
    return out


def ratios(result: dict) -> dict:
    out = {}
    openai_runs = [m for m in result["measures"] if m["label"].startswith("/v1") and m["concurrency"] == STREAMS]
    grpc_runs = [m for m in result["measures"] if m["label"].startswith("ModelStreamInfer")]
    single = next((m for m in result["measures"] if m["concurrency"] == 1), None)
    if openai_runs and grpc_runs:
        o = float(np.median([m["infer_per_s"] for m in openai_runs]))
        g = float(np.median([m["infer_per_s"] for m in grpc_runs]))
        oc = float(np.median([m["cpu_us_per_token"] for m in openai_runs]))
        gc = float(np.median([m["cpu_us_per_token"] for m in grpc_runs]))
        out["/v1 tokens/s over gRPC ModelStreamInfer's, same load"] = f"{o / g:.2f}x"
        out["/v1 server CPU per token over gRPC's"] = f"{oc / gc:.2f}x ({oc:.0f} vs {gc:.0f} us)"
        if single:
            out["32 concurrent /v1 streams' tokens/s over one at a time"] = f"{o / single['infer_per_s']:.1f}x"
    return out
