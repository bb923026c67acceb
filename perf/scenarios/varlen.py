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
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import asdict
from pathlib import Path

import numpy as np

LENGTH_MEDIAN, LENGTH_SIGMA, LENGTH_MIN, LENGTH_MAX = 40, 0.9, 8, 512
SAMPLES = 512
CONCURRENCY = 32
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
            padding = {"padding + buckets": b.ENCODER_PADDING, "padding alone": padding_alone}.get(mode)
            text = b.encoder_config(name, platform, padding, None if mode == "no batching" else "", threads)
            specs.append(b.ModelSpec(name, text, {f"1/{filename}": files[runtime]}))
    b.build_repository(root, models=specs, log=None)
    return root


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
    from perf.bench import run_pa

    before, cpu0 = _metrics(metrics, model), _cpu_seconds(pid)
    m = run_pa(label, model, url, CONCURRENCY, window_ms=window_ms, extra=extra)
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
    from perf.bench import OUT, start_inferd

    repo = repository(OUT / "repo_varlen")
    token_counts = lengths()
    data = {True: input_data(OUT / "varlen_mask.json", token_counts, True),
            False: input_data(OUT / "varlen_ids.json", token_counts, False)}
    window_ms = 3000 if quick else 5000
    out: dict = {"measures": [], "ceilings": {}}
    server, url = start_inferd(repo)
    try:
        found = re.search(r"metrics on (\S+/metrics)", server.log.read_text())
        assert found, server.log.read_text()
        metrics, pid = "http://" + found.group(1), server.proc.pid
        out["measures"].append(_measure(CEILING, "identity_fp32", url, metrics, pid, window_ms,
                                        ["--shape", "INPUT0:40"]))
        for runtime, *_ in RUNTIMES:
            for mode in MODES:
                padded = mode.startswith("padding")
                out["measures"].append(_measure(f"{runtime}: {mode}", model_name(runtime, mode), url, metrics, pid,
                                                window_ms, ["--input-data", str(data[not padded])]))
    finally:
        server.stop()
    out["notes"] = (f"Request lengths: {SAMPLES} draws, median {float(np.median(token_counts)):.0f}, mean "
                    f"{np.mean(token_counts):.0f}, max {max(token_counts)} tokens, {len(set(token_counts))} distinct "
                    "lengths. Waste = padding elements / real elements of INPUT_IDS; CPU is the server process's "
                    "(user + system) per inference. The machine (2 cores) was shared with other engineers' builds "
                    "and tests while this ran, and perf_analyzer shares the cores with the server.")
    return out


def ratios(result: dict) -> dict:
    by = {m["label"]: m for m in result["measures"]}
    out = {}
    ceiling = by.get(CEILING)
    for runtime, *_ in RUNTIMES:
        base = by.get(f"{runtime}: exact shapes only")
        for mode in MODES:
            m = by.get(f"{runtime}: {mode}")
            if not m or not m["infer_per_s"]:
                continue
            if base and base["infer_per_s"] and mode != "exact shapes only":
                out[f"{runtime}: {mode} / exact shapes only throughput"] = (
                    f"{m['infer_per_s'] / base['infer_per_s']:.2f}x"
                    + (" (target: >= 3x)" if mode == "padding + buckets" else ""))
            if mode == "padding + buckets" and ceiling and ceiling["infer_per_s"]:
                out[f"{runtime}: padding + buckets / request-path ceiling"] = (
                    f"{m['infer_per_s'] / ceiling['infer_per_s']:.2f}x")
    return out
