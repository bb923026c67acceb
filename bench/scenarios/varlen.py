"""Variable-length batching: the example text encoder (inferd/examples/encoder.py) as ONNX and as
TorchScript under requests whose lengths follow a long-tailed distribution (lognormal, median 40
tokens, sigma 0.9, redrawn outside 8-512), perf_analyzer at concurrency 32, four configurations of
each model file on one server: padding + length buckets (+ the element budget: the example's
config), padding alone, exact-shape-only dynamic batching (requests share a batch only at equal
lengths) and no batching. All execute on the instance's thread with one intra-op thread (the
event loop and perf_analyzer need the other core). perf_analyzer takes each request's length from
--input-data JSON (one entry per request, each with its own shape; the padded models get
INPUT_IDS alone, the others the mask too). The padding waste (padding / real elements) comes from
the server's /metrics, the mean batch and CPU per inference (server process, /proc) from the same
run; identity_fp32 with 40-element requests on the same server is the request path's ceiling.
perf_analyzer's stability threshold is 40% (the machine is shared). The configurations run in two
alternating rounds (the order flips each round); the ratios are medians of the rounds' ratios, for
throughput and for server CPU per inference (the steadier figure on a shared machine).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

LENGTH_MEDIAN, LENGTH_SIGMA, LENGTH_MIN, LENGTH_MAX = 40, 0.9, 8, 512
SAMPLES = 512
CONCURRENCY = 32
ROUNDS = 2
# perf_analyzer's stability threshold (%): 40 instead of bench's 15/30, since on this shared machine
# (load average 10-20 on 2 cores) long-tailed lengths at concurrency 32 rarely hold 30% for 3 windows.
STABILITY = "40"
MODES = ("padding + buckets", "padding alone", "exact shapes only", "no batching")
RUNTIMES = (("onnx", "onnxruntime_onnx", "model.onnx"), ("torch", "pytorch_libtorch", "model.pt"))
CEILING = "request-path ceiling: identity_fp32, 40 elements"


def model_name(runtime: str, mode: str) -> str:
    return f"{runtime}_" + {"padding + buckets": "buckets", "padding alone": "padding",
                            "exact shapes only": "exact", "no batching": "nobatch"}[mode]


def lengths(count: int = SAMPLES, seed: int = 0) -> list[int]:
    """Token counts from a lognormal, redrawn (not clipped) outside [LENGTH_MIN, LENGTH_MAX]."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < count:
        n = int(round(rng.lognormal(np.log(LENGTH_MEDIAN), LENGTH_SIGMA)))
        if LENGTH_MIN <= n <= LENGTH_MAX:
            out.append(n)
    return out


def input_data(path: Path, token_counts: list[int], with_mask: bool) -> Path:
    rng = np.random.default_rng(1)
    steps = []
    for n in token_counts:
        step = {"INPUT_IDS": {"content": rng.integers(1, 1000, n).tolist(), "shape": [n]}}
        if with_mask:
            step["ATTENTION_MASK"] = {"content": [1] * n, "shape": [n]}
        steps.append(step)
    path.write_text(json.dumps({"data": steps}))
    return path


def repository(root: Path) -> Path:
    from inferd.examples import build as b
    from inferd.examples import encoder

    files = {"onnx": encoder.onnx_bytes(), "torch": encoder.torchscript_bytes()}
    padding_alone = {"inferd.padding": "true", "inferd.mask_input": "ATTENTION_MASK"}
    specs = [s for s in b.MODELS if s.name == "identity_fp32"]
    for runtime, platform, filename in RUNTIMES:
        threads = {"intra_op_thread_count": 1} if runtime == "onnx" else {"INTRA_OP_THREAD_COUNT": 1}
        for mode in MODES:
            name = model_name(runtime, mode)
            padding = (b.ENCODER_PADDING if mode == "padding + buckets"
                       else padding_alone if mode == "padding alone" else None)
            text = b.encoder_config(name, platform, padding, None if mode == "no batching" else "", threads)
            specs.append(b.ModelSpec(name, text, {f"1/{filename}": files[runtime]}))
    b.build_repository(root, models=specs, log=None)
    return root


def raw_runners() -> dict[str, Callable[[np.ndarray, np.ndarray], object]]:
    """The example encoder called directly, one intra-op thread: ONNX Runtime and TorchScript."""
    import io

    import onnxruntime as ort
    import torch

    from inferd.examples import encoder

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    session = ort.InferenceSession(encoder.onnx_bytes(), sess_options=options, providers=["CPUExecutionProvider"])
    module = torch.jit.load(io.BytesIO(encoder.torchscript_bytes()))

    def torch_run(ids: np.ndarray, mask: np.ndarray) -> object:
        torch.set_num_threads(1)
        with torch.inference_mode():
            return module(torch.from_numpy(ids), torch.from_numpy(mask))

    return {"onnxruntime": lambda ids, mask: session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask}),
            "torchscript": torch_run}


def raw_rates(name: str, run_batch: Callable[[np.ndarray, np.ndarray], object], token_counts: list[int],
              buckets: tuple[int, ...], budget: int, batch: int = 8) -> dict[str, float]:
    """Requests per CPU second of the bare runtime (one thread: the calling one, whose CPU time is
    measured, so the neighbours' load hardly matters) over the same lengths: one request per run,
    bucketed padded batches of up to ``batch`` rows within the element ``budget`` (consecutive
    requests of a bucket, as the queue forms them), and padded batches of 32 with no buckets."""
    import time
    from bisect import bisect_left

    rng = np.random.default_rng(2)

    def run(group: list[int]) -> None:
        ids = np.zeros((len(group), max(group)), np.int64)
        mask = np.zeros_like(ids)
        for i, n in enumerate(group):
            ids[i, :n], mask[i, :n] = rng.integers(1, 1000, n), 1
        run_batch(ids, mask)

    def rate(groups: list[list[int]]) -> float:
        for g in groups[:3]:
            run(g)  # warm up
        t0 = time.thread_time()
        for g in groups:
            run(g)
        return sum(len(g) for g in groups) / (time.thread_time() - t0)

    open_groups: dict[int, list[int]] = {}
    bucketed: list[list[int]] = []
    for n in token_counts:
        group = open_groups.setdefault(bisect_left(buckets, n), [])
        if group and (len(group) == batch or (len(group) + 1) * max(max(group), n) > budget):
            bucketed.append(group[:])
            group.clear()
        group.append(n)
    bucketed += [g for g in open_groups.values() if g]
    return {
        f"raw {name}, requests per CPU second, one request per run": rate([[n] for n in token_counts]),
        f"raw {name}, requests per CPU second, bucketed padded batches (up to {batch} rows, {budget} elements)": rate(bucketed),
        f"raw {name}, requests per CPU second, padded batches of 32, no buckets": rate(
            [token_counts[i:i + 32] for i in range(0, len(token_counts), 32)]),
    }


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _metrics(url: str, model: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    out = {}
    for metric in ("inferd_inference_count_total", "inferd_inference_exec_count_total",
                   "inferd_inference_real_elements_total", "inferd_inference_pad_elements_total"):
        m = re.search(rf'^{metric}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        out[metric] = float(m.group(1)) if m else 0.0
    return out


def _measure(label: str, model: str, url: str, metrics: str, pid: int, window_ms: int, extra: list[str]) -> dict:
    from bench.bench import run_pa

    before, cpu0 = _metrics(metrics, model), _cpu_seconds(pid)
    m = run_pa(label, model, url, CONCURRENCY, window_ms=window_ms, extra=[*extra, "-s", STABILITY])
    after, cpu1 = _metrics(metrics, model), _cpu_seconds(pid)
    d = {k: after[k] - before[k] for k in after}
    inferences, executions = d["inferd_inference_count_total"], d["inferd_inference_exec_count_total"]
    real, pad = d["inferd_inference_real_elements_total"], d["inferd_inference_pad_elements_total"]
    waste = pad / real if real else 0.0
    cpu_us = (cpu1 - cpu0) / inferences * 1e6 if inferences else 0.0
    mean_batch = inferences / executions if executions else 0.0
    m.note = "; ".join(x for x in (m.note, f"waste {waste:.2f}", f"mean batch {mean_batch:.1f}",
                                   f"server CPU {cpu_us:,.0f} us/inference") if x)
    return asdict(m)


def run(quick: bool) -> dict:
    from bench.bench import OUT, start_inferd

    repo = repository(OUT / "repo_varlen")
    token_counts = lengths()
    data = {True: input_data(OUT / "varlen_mask.json", token_counts, True),
            False: input_data(OUT / "varlen_ids.json", token_counts, False)}
    window_ms = 3000 if quick else 4000
    plan = [(CEILING, "identity_fp32", ["--shape", "INPUT0:40"])] + [
        (f"{runtime}: {mode}", model_name(runtime, mode),
         ["--input-data", str(data[not mode.startswith("padding")])])
        for runtime, *_ in RUNTIMES for mode in MODES]
    out: dict = {"measures": [], "ceilings": {}}
    server, url = start_inferd(repo)
    try:
        found = re.search(r"metrics on (\S+/metrics)", server.log.read_text())
        assert found, server.log.read_text()
        metrics, pid = "http://" + found.group(1), server.proc.pid
        for r in range(1 if quick else ROUNDS):
            for label, model, extra in plan if r % 2 == 0 else plan[::-1]:
                m = _measure(label, model, url, metrics, pid, window_ms, extra)
                m["note"] += f"; round {r + 1}"
                out["measures"].append(m)
    finally:
        server.stop()
    from inferd.examples import build as b

    buckets = tuple(int(x) for x in b.ENCODER_BUCKETS.split(","))
    for name, run_batch in raw_runners().items():
        out["ceilings"].update(raw_rates(name, run_batch, token_counts, buckets, b.ENCODER_MAX_BATCH_ELEMENTS))
    out["notes"] = (f"Request lengths: {SAMPLES} draws, median {float(np.median(token_counts)):.0f}, mean "
                    f"{np.mean(token_counts):.0f}, max {max(token_counts)} tokens, {len(set(token_counts))} distinct "
                    "lengths. Waste = padding elements / real elements of INPUT_IDS; CPU is the server process's "
                    "(user + system) per inference, model threads included. The machine (2 cores) was shared with "
                    "other engineers' builds, tests and benchmarks while this ran (load average above 10), and "
                    "perf_analyzer shares the cores with the server: throughput and latency swing with the "
                    "neighbours' load; CPU per inference much less.\n\n"
                    "Why padding + buckets stays far from 3x exact-shape-only here: on these CPUs the runtimes gain "
                    "nothing from batching this encoder: the bare session runs the same requests slower in bucketed "
                    "padded batches than one by one (the ceilings above: padded tokens are computed too, and "
                    "attention grows as rows x length^2), so what batching saves is inferd's per-execution cost "
                    "(dispatch, the worker-thread hand-off, joining and splitting), a small part of the ~0.35 ms of "
                    "server CPU that the request path alone costs per request (identity_fp32 row). Padding alone, "
                    "with waste above 2 (a 500-token request pads 31 short ones), costs 2-3x the server CPU per "
                    "inference of no batching: "
                    "buckets are what make padding pay. On a GPU, where one execution's cost barely depends on its "
                    "batch, the same scheduling would be expected to show far larger ratios; none was available.")
    return out


def _cpu_us(m: dict) -> float:
    found = re.search(r"server CPU ([\d,]+) us/inference", m["note"])
    return float(found.group(1).replace(",", "")) if found else 0.0


def ratios(result: dict) -> dict:
    rounds: dict[int, dict[str, dict]] = {}
    for m in result["measures"]:
        found = re.search(r"round (\d+)", m["note"])
        r = int(found.group(1)) if found else 1
        rounds.setdefault(r, {})[m["label"]] = m

    def median(values: list[float]) -> str:
        return f"{float(np.median(values)):.2f}x (rounds: {', '.join(f'{v:.2f}' for v in values)})" if values else "n/a"

    out = {}
    for runtime, *_ in RUNTIMES:
        for mode in MODES:
            if mode == "exact shapes only":
                continue
            label, base = f"{runtime}: {mode}", f"{runtime}: exact shapes only"
            pairs = [(by[label], by[base]) for by in rounds.values() if label in by and base in by]
            speed = [m["infer_per_s"] / b["infer_per_s"] for m, b in pairs if m["infer_per_s"] and b["infer_per_s"]]
            cpu = [_cpu_us(b) / _cpu_us(m) for m, b in pairs if _cpu_us(m) and _cpu_us(b)]
            target = " (target: >= 3x)" if mode == "padding + buckets" else ""
            out[f"{label} / exact shapes only: throughput"] = median(speed) + target
            out[f"{label} / exact shapes only: inferences per server CPU second"] = median(cpu)
    return out
