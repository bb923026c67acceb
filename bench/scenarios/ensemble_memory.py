"""An ensemble's memory while a fast step feeds a slow one at ten times its rate, with and without
``max_inflight_requests`` (issue #30). ``widen`` (a Python model) turns each request's one number
into a 1 MiB intermediate tensor; ``drain`` (a Python model, one instance) takes 100 ms per request
to read it back. An open-loop asyncio tritonclient offers the ensemble 100 requests/s (ten times what
drain serves) for the window; the core process's RSS is sampled every 0.2 s, each ensemble on a fresh
server (default process mode), and the requests still unanswered at the end are cancelled. With the
limit (2, so at most 4 requests past the fast step) the RSS stays flat: what it still gains is the
waiting requests' own state (their call, task and small input; a few KiB each, bounded by
--max-queued-requests); without it every request offered parks its 1 MiB before the slow step. RSS
over time: bench/results/ensemble_memory.png."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

NEEDS_PERF_ANALYZER = False  # it drives its own client
MiB = 1 << 20
WIDE = MiB // 4  # float32 elements: 1 MiB
SLOW_S = 0.1  # drain's time per request
RATE = 10 / SLOW_S  # offered requests/s: ten times drain's rate
LIMIT = 2
SAMPLE_S = 0.2

WIDEN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "WIDE", np.full({wide}, pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0], np.float32))])
            for r in requests]
'''

DRAIN = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({slow})
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "WIDE").as_numpy()[:1] * 1)]) for r in requests]
'''


def _repo(root: Path) -> Path:
    from inferd.examples.build import ensemble_steps, triton_config

    repo = root / "repo_ensemble_memory"
    one, wide, out = ("INPUT0", "TYPE_FP32", [1]), ("WIDE", "TYPE_FP32", [WIDE]), ("OUTPUT0", "TYPE_FP32", [1])
    for name, source, ins, outs in (("widen", WIDEN.format(wide=WIDE), one, wide),
                                    ("drain", DRAIN.format(slow=SLOW_S), wide, out)):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "1" / "model.py").write_text(source)
        (repo / name / "config.pbtxt").write_text(triton_config(name, [ins], [outs], platform=None, backend="python"))
    steps = [("widen", {"INPUT0": "INPUT0"}, {"WIDE": "wide"}), ("drain", {"WIDE": "wide"}, {"OUTPUT0": "OUTPUT0"})]
    for name, limit in (("bounded", LIMIT), ("unbounded", 0)):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(triton_config(
            name, [one], [out], platform="ensemble", instance_count=0, extra=ensemble_steps(steps, limit)))
    return repo


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def _drive(url: str, pid: int, model: str, seconds: float) -> dict:
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)

    async def one(i: int) -> None:
        x = aioclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([i], np.float32))
        await client.infer(model, [x])

    for i in range(3):  # warm: both models have run
        await one(i)
    start_rss = _rss(pid)
    calls: list[asyncio.Future] = []
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    next_sample = t0
    try:
        while (now := time.monotonic()) < t0 + seconds:
            due = int((now - t0) * RATE) + 1
            while len(calls) < due:  # open loop: on schedule, whatever is answered
                calls.append(asyncio.ensure_future(one(len(calls))))
            if now >= next_sample:
                samples.append((round(now - t0, 2), (_rss(pid) - start_rss) / MiB))
                next_sample += SAMPLE_S
            await asyncio.sleep(min(1 / RATE, max(0.0, next_sample - time.monotonic())))
        answered = sum(c.done() and c.exception() is None for c in calls)
    finally:
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
    return {"model": model, "seconds": seconds, "offered": len(calls), "answered": answered,
            "start_rss_mib": start_rss / MiB,
            "peak_growth_mib": max(g for _, g in samples), "final_growth_mib": samples[-1][1], "samples": samples}


def _plot(runs: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in runs:
        ax.plot([t for t, _ in r["samples"]], [g for _, g in r["samples"]], label=r["label"])
    ax.set_xlabel("seconds")
    ax.set_ylabel("core RSS growth (MiB)")
    ax.legend()
    ax.set_title(f"fast step (1 MiB out) -> slow step ({SLOW_S * 1000:.0f} ms), offered {RATE:.0f}/s; "
                 "shared 2-core machine")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def run(quick: bool) -> dict:
    from bench.bench import OUT, RESULTS_DIR, start_inferd

    repo = _repo(OUT)
    seconds = 3.0 if quick else 6.0
    runs = []
    for model, label in (("bounded", f"max_inflight_requests {LIMIT}"), ("unbounded", "no limit")):
        server, url = start_inferd(repo)
        try:
            result = asyncio.run(_drive(url, server.proc.pid, model, seconds))
        finally:
            server.stop()
        result["label"] = label
        runs.append(result)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _plot(runs, RESULTS_DIR / "ensemble_memory.png")
    table = ["| second | " + " | ".join(r["label"] for r in runs) + " |", "|---:|" + "---:|" * len(runs)]
    for t in range(int(seconds) + 1):  # the sample nearest each whole second
        near = [min(r["samples"], key=lambda s: abs(s[0] - t)) for r in runs]
        table.append(f"| {t} | " + " | ".join(f"{g:+.1f} MiB" for _, g in near) + " |")
    notes = ("Core RSS growth over the warm server's, at (the sample nearest) each second; every sample "
             "is in the JSON. The client is open loop (no concurrency limit), so latency is not measured:\n\n"
             + "\n".join(table) + "\n\n![ensemble memory: core RSS over time](results/ensemble_memory.png)")
    measures = [{"label": r["label"], "concurrency": 0, "batch": 1, "infer_per_s": r["answered"] / seconds,
                 "p50_us": 0.0, "p99_us": 0.0,
                 "note": (f"offered {r['offered']} in {seconds:.0f} s, answered {r['answered']}; core RSS "
                          f"{r['start_rss_mib']:.0f} MiB, growth peak {r['peak_growth_mib']:+.1f} MiB, at the end "
                          f"{r['final_growth_mib']:+.1f} MiB")} for r in runs]
    return {"measures": measures, "runs": runs, "notes": notes}


def ratios(result: dict) -> dict:
    runs = {r["model"]: r for r in result.get("runs", [])}
    if set(runs) != {"bounded", "unbounded"}:
        return {}
    b, u = runs["bounded"], runs["unbounded"]
    return {
        "core RSS growth, peak: limit vs none": f"{b['peak_growth_mib']:+.1f} MiB vs {u['peak_growth_mib']:+.1f} MiB",
        "answered per second (the slow step's rate): limit vs none": f"{b['answered'] / b['seconds']:.1f} vs "
                                                                     f"{u['answered'] / u['seconds']:.1f}",
    }
