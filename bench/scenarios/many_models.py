"""Many models under concurrency (issue 43): ONNX table models of mixed sizes (inferd/examples/many_models.py;
full: 40 of 5-60 MB, 1.3 GB of tables; quick: 24 of 2-30 MB) behind ``--model-control-mode on_demand``, and
8 tritonclient gRPC clients (bench/paced_client.py, a process of its own) sending a Zipf stream (s = 1.1,
the same seeded stream in every run) at a paced rate, open loop: each request starts at its scheduled time
whatever the others are doing, so the budgeted server and the every-model-loaded one are offered the
same load (a closed loop offers less while cold requests are slow, which flatters the budgeted run);
latency counts from that scheduled time. The server is `inferd serve --frontend-workers 0` (one process:
the gRPC frontend on the core's loop) run inside the benchmark, so that a request is known cold exactly
when it waited for its model's load (the driver's wait sees its request id), which a client cannot tell
when several clients load and evict beside it. The GIL switch interval is `inferd serve`'s (100 us).
For each ``--model-host``: ``inline`` (every table in the server's process), ``auto`` (the default:
in the server's process without a budget; under one, tables from 4 MiB up in model hosts, here every
table (until 12-07 from 16 MiB up, the smaller ones in the server's process); its every-model-loaded
server has a budget that holds them all, so that it places the tables as the budgeted one does) and
``process`` (each model in a model host): (1) every model loaded alone, one after the other, on a server
without a budget (auto: one holding them all): each load's time ("one load's time": its first request,
in the server's process, no network) and the growth of the process tree's summed PSS (proportional set
size: each page counted once across the server, the zygote and the hosts) and RSS against the model's
footprint (ModelStatistics memory_usage); (2) the stream with every model loaded: warm latency; (3) a fresh server with
``--model-memory-budget`` a third of the footprints' sum, every model asked for once in turn (its first
load measures it, alone: the stream then sees the steady state of a server that has run a while,
reloads), then the same stream; cold and warm latency,
loads and evictions per second. (2) and (3) alternate: four rounds, each on its own quarter of the
stream, in the order L B, B L, L B, B L; one load's time is each model's median over the rounds. (4) The
tree's peak PSS against its PSS at start-up plus the budget, in a pass of its own: a budgeted server
as in (3), the whole stream, the client process sampling the tree every 0.25 s. Its latencies are not
the scenario's: a sample walks every process's page tables (~2 ms of kernel time per model host and per
100 MiB of the server, ~0.1 s a sample with every model loaded in hosts) and doubled the warm p99 of the
every-model-loaded server when the rounds carried it (12-06: 8-10 against 4-6 ms; the pass's own warm
latency is reported with its peak). (5) The control: each every-model-loaded server also runs its quarter of the
stream a second time (first in rounds 2 and 4) with a busy loop at SCHED_IDLE, the policy hosts load at,
on every core: no load, no memory traffic, only the cores kept busy at the lowest priority, as a
budgeted server's loads keep them (6.7-7 loads a second of ~0.1 s of CPU each, two at a time). What
it does to warm latency is what loads beside warm requests cost on these cores whatever the server. The
machine (2 cores, the client beside the server) was shared with other engineers' builds and tests while
this ran: compare ratios within one run; the load average is in the notes."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench import OUT
from bench.paced_client import tree_pss

NEEDS_PERF_ANALYZER = False
SWITCH_INTERVAL = 100e-6  # as `inferd serve` sets it (--gil-switch-interval-us)
MiB = 2**20
HOSTS = ("inline", "auto", "process")  # --model-host (module docstring)
HOLDS_ALL = 2**40  # a budget no repository here reaches
LABELS = {"inline": "ONNX in the server's process (inline)",
          "auto": "the default (auto: under the budget, tables from 4 MiB in hosts)",
          "process": "ONNX in model hosts (process)"}
CLIENTS = 8
ROUNDS = 4
SAMPLE_S = 0.25  # the memory pass's PSS sampling interval
ROOT = Path(__file__).resolve().parents[2]


def _config(quick: bool) -> dict:
    rate = float(os.environ.get("INFERD_BENCH_RATE", "20"))  # requests per second, all clients together
    if quick:
        return {"models": 24, "low_mb": 2, "high_mb": 30, "rate": rate, "seconds": 30.0}
    return {"models": 40, "low_mb": 5, "high_mb": 60, "rate": rate, "seconds": 60.0}


def _stream(models: int, n: int) -> list[int]:
    rng = np.random.default_rng(1100)
    p = 1.0 / np.arange(1, models + 1) ** 1.1
    return [int(m) for m in rng.permutation(models)[rng.choice(models, size=n, p=p / p.sum())]]


def _request(name: str, k: int):  # type: ignore[no-untyped-def]
    from inferd.types import InferenceRequest

    return InferenceRequest(model_name=name, inputs={"I": np.array([k], dtype=np.int64)})


def _pss() -> int:
    return tree_pss(os.getpid(), set())


def _rss() -> int:
    from inferd.observability.procfs import all_stats, server_tree
    from inferd.repository.footprint import rss_bytes

    return sum(rss_bytes(s.pid) for s in server_tree(os.getpid(), all_stats()))


class Server:
    """An in-process `inferd serve --frontend-workers 0` on a free loopback port; records the ids of
    the requests that waited for a load."""

    def __init__(self, repo: Path, host: str, budget: int | None) -> None:
        from inferd.serve.one_process import InferenceServer, ServerOptions

        self.server = InferenceServer(ServerOptions(
            model_repositories=[repo], grpc_port=0, address="127.0.0.1", allow_http=False, allow_metrics=False,
            model_control_mode="on_demand", model_memory_budget=budget, model_host=host, grace_seconds=10.0))
        self.cold: set[str] = set()

    async def __aenter__(self) -> "Server":
        await self.server.start()
        demand = self.server.manager.demand
        assert demand is not None
        wait = demand.wait

        async def recorded(name: str, request=None) -> None:  # type: ignore[no-untyped-def]
            if request is not None:
                self.cold.add(request.id)
            await wait(name, request)

        demand.wait = recorded  # type: ignore[method-assign]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(10.0)
        self.server.hosts.kill_all()

    @property
    def demand(self):  # type: ignore[no-untyped-def]
        return self.server.manager.demand

    async def infer(self, name: str, k: int):  # type: ignore[no-untyped-def]
        return await self.server.dataplane.infer(_request(name, k))

    def counts(self) -> dict[str, int]:
        counters = self.demand.counters.values()
        return {"loads": sum(c.loads for c in counters), "evictions": sum(c.evictions for c in counters),
                "refusals": sum(c.refusals for c in counters)}


async def _load_each(server: Server, names: list[str], measure: bool) -> list[dict]:
    """Each model loaded alone (its first request, in-process): its load's time; when ``measure``, its
    footprint and the tree's PSS and RSS growth (settled first: 0.3 s before and after)."""
    from inferd.examples.many_models import expected

    rows = []
    for i, name in enumerate(names):
        if measure:
            gc.collect()
            await asyncio.sleep(0.3)
            pss, rss = _pss(), _rss()
        t = time.perf_counter()
        response = await server.infer(name, 7)
        row = {"model": name, "load_ms": (time.perf_counter() - t) * 1e3}
        assert float(response.outputs["Y"][0]) == expected(i, 7)
        if measure:
            await asyncio.sleep(0.3)
            entry = server.server.manager.known[name]
            row.update(footprint=server.demand.footprints[name], pss_growth=_pss() - pss, rss_growth=_rss() - rss,
                       table=int(entry.path.joinpath("1", "model.onnx").stat().st_size))
        rows.append(row)
    return rows


async def _paced(server: Server, schedule: list[int], rate: float, sample: bool = False) -> dict:
    """``schedule`` from the client process; per request its latency and whether it waited for a load;
    when ``sample``, the tree's peak PSS meanwhile (module docstring, (4))."""
    work = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None))
    (work / "schedule.json").write_text(json.dumps(schedule))
    before = server.counts()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.paced_client", "--url", f"127.0.0.1:{server.server.grpc_port}",
        "--server-pid", str(os.getpid()), "--rate", str(rate), "--clients", str(CLIENTS),
        "--schedule", str(work / "schedule.json"), "--out", str(work / "out.json"),
        "--sample-s", str(SAMPLE_S if sample else 0), env=env, cwd=str(ROOT))
    t = time.perf_counter()
    code = await proc.wait()
    seconds = time.perf_counter() - t
    if code != 0:
        raise RuntimeError(f"bench.paced_client exited with {code}")
    got = json.loads((work / "out.json").read_text())
    after = server.counts()
    warm, cold, errors = [], [], []
    for k, model, took, ok, error in got["requests"]:
        if error or not ok:
            errors.append(error or f"m{model:02d}[{k}]: a wrong answer")
        (cold.append((took, f"m{model:02d}")) if str(k) in server.cold else warm.append(took))
    return {"warm": warm, "cold": cold, "errors": errors, "seconds": seconds, "peak_pss": got["peak_pss"],
            **{key: after[key] - before[key] for key in after}}


async def _round(repo: Path, names: list[str], host: str, half: list[int], rate: float, budget: int | None,
                 measure: bool, sample: bool = False, busy_first: bool | None = None) -> dict:
    """One server: without a budget, every model loaded (alone, measured when ``measure``) then the
    stream (and, unless ``busy_first`` is None, which a budgeted round's is, the stream again beside
    idle-policy work on every core: first when ``busy_first``); with one, every model asked for once, one
    after the other (each measured at its first load, as a server that has run a while has: the stream
    sees the steady state, reloads), then the stream."""
    gc.collect()
    await asyncio.sleep(1.0)
    # auto places models by whether there is a budget: its every-model-loaded server gets one that holds
    # them all, so both of its runs place each table alike and differ only by the loads.
    async with Server(repo, host, HOLDS_ALL if budget is None and host == "auto" else budget) as server:
        await asyncio.sleep(0.5)
        base = _pss()
        alone = await _load_each(server, names, measure and budget is None)
        await asyncio.sleep(0.5)
        loaded_pss = _pss() if budget is None else 0  # every model loaded: one walk, before the stream starts
        if budget is not None:
            alone = []
            await asyncio.sleep(0.5)
        busy: list[float] = []  # the control (module docstring, (5)), before or after the stream
        if busy_first:
            busy = await _beside_idle_work(server, half, rate)
        got = await _paced(server, half, rate, sample)
        if busy_first is False:
            busy = await _beside_idle_work(server, half, rate)
    return {**got, "alone": alone, "base_pss": base, "loaded_pss": loaded_pss, "busy_warm": busy}


async def _beside_idle_work(server: Server, part: list[int], rate: float) -> list[float]:
    """The stream's warm latencies while a busy loop at SCHED_IDLE runs on every core (no load, no server
    work, no memory traffic: only the cores kept busy at the lowest priority)."""
    spin = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass"
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", spin) for _ in range(os.cpu_count() or 1)]
    try:
        return (await _paced(server, part, rate))["warm"]
    finally:
        for proc in procs:
            proc.kill()
            await proc.wait()


async def _host(repo: Path, names: list[str], host: str, stream: list[int], rate: float) -> dict:
    """ROUNDS rounds, each on its own part of the stream, every-model-loaded and budgeted alternating
    (L B, B L, L B, ...): a neighbour's burst on the shared machine lands on both about alike. Each
    model's load time is the median of its loads alone over the every-model-loaded rounds."""
    parts = [stream[i * len(stream) // ROUNDS:(i + 1) * len(stream) // ROUNDS] for i in range(ROUNDS)]
    loaded, budgeted = [], []
    budget = 0
    for i, part in enumerate(parts):
        for with_budget in ((False, True) if i % 2 == 0 else (True, False)):
            if with_budget:
                budgeted.append(await _round(repo, names, host, part, rate, budget, False))
            else:
                loaded.append(await _round(repo, names, host, part, rate, None, i == 0, busy_first=i % 2 == 1))
                if i == 0:
                    budget = sum(r["footprint"] for r in loaded[0]["alone"]) // 3
    alone = [dict(r, load_ms=float(np.median([run["alone"][j]["load_ms"] for run in loaded])))
             for j, r in enumerate(loaded[0]["alone"])]
    memory = await _round(repo, names, host, stream, rate, budget, False, sample=True)
    return {"host": host, "alone": alone, "loaded": loaded, "budgeted": budgeted, "budget": budget, "memory": memory}


def run(quick: bool) -> dict:
    from inferd import event_loop
    from inferd.examples.many_models import build_many, mixed_sizes

    cfg = _config(quick)
    repo = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None)) / "repo"
    names = build_many(repo, cfg["models"], mixed_sizes(cfg["models"], cfg["low_mb"], cfg["high_mb"]))
    stream = _stream(cfg["models"], int(cfg["rate"] * cfg["seconds"]))
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        details = []
        for host in HOSTS:
            load = os.getloadavg()[0]
            got = event_loop.run(_host(repo, names, host, stream, cfg["rate"]), event_loop.resolve("auto"))
            got["loadavg"] = (load, os.getloadavg()[0])
            details.append(got)
    finally:
        sys.setswitchinterval(before)
    summaries = [_summary(d) for d in details]
    return {"measures": [m for d, s in zip(details, summaries) for m in _measures(d, s, cfg["rate"])],
            "details": summaries, "config": cfg, "notes": _notes(summaries)}


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else 0.0


def _pooled(runs: list[dict], key: str) -> list:
    return [x for r in runs for x in r[key]]


def _summary(d: dict) -> dict:
    alone, budgeted, loaded = d["alone"], d["budgeted"], d["loaded"]
    by_model = {r["model"]: r["load_ms"] / 1e3 for r in alone}
    cold = _pooled(budgeted, "cold")
    stretch = [c / by_model[m] for c, m in cold]
    ratios = [r["footprint"] / r["pss_growth"] for r in alone[1:] if r["pss_growth"] > 0]
    seconds = sum(r["seconds"] for r in budgeted)
    return {
        "host": d["host"], "budget": d["budget"], "loadavg": d["loadavg"],
        "footprints": sum(r["footprint"] for r in alone), "tables": sum(r["table"] for r in alone),
        "pss_growth": sum(r["pss_growth"] for r in alone), "rss_growth": sum(r["rss_growth"] for r in alone),
        "within_15pct": sum(1 for x in ratios if abs(x - 1) <= 0.15), "compared": len(ratios),
        "ratio_min": min(ratios, default=0.0), "ratio_max": max(ratios, default=0.0),
        "ratio_median": float(np.median(ratios)) if ratios else 0.0,
        "one_load_p50_s": _pct(list(by_model.values()), 50), "one_load_p99_s": _pct(list(by_model.values()), 99),
        "cold_p50_s": _pct([c for c, _ in cold], 50), "cold_p99_s": _pct([c for c, _ in cold], 99),
        "cold_count": len(cold), "stretch_p50": _pct(stretch, 50), "stretch_p99": _pct(stretch, 99),
        "warm_p99_budgeted_s": _pct(_pooled(budgeted, "warm"), 99),
        "warm_p99_loaded_s": _pct(_pooled(loaded, "warm"), 99),
        "warm_p50_budgeted_s": _pct(_pooled(budgeted, "warm"), 50),
        "warm_p50_loaded_s": _pct(_pooled(loaded, "warm"), 50),
        "warm_p99_busy_s": _pct(_pooled(loaded, "busy_warm"), 99),
        "warm_p50_busy_s": _pct(_pooled(loaded, "busy_warm"), 50),
        "rounds_busy_p99": [(_pct(a["busy_warm"], 99), _pct(a["warm"], 99)) for a in loaded],
        "rounds_p99": [(_pct(b["warm"], 99), _pct(a["warm"], 99)) for b, a in zip(budgeted, loaded)],
        "ratio_of_rounds": float(np.median([_pct(b["warm"], 99) / max(_pct(a["warm"], 99), 1e-9)
                                            for b, a in zip(budgeted, loaded)])),
        "loads_per_s": sum(r["loads"] for r in budgeted) / seconds,
        "evictions_per_s": sum(r["evictions"] for r in budgeted) / seconds,
        "refusals": sum(r["refusals"] for r in budgeted),
        "errors": len(_pooled(budgeted, "errors")) + len(_pooled(loaded, "errors")),
        "error_sample": (_pooled(budgeted, "errors") + _pooled(loaded, "errors"))[:3],
        "peak": (d["memory"]["peak_pss"], d["memory"]["base_pss"]),
        "pss_loaded": max(r["loaded_pss"] for r in loaded),
        "memory_pass": {"warm_p99_s": _pct(d["memory"]["warm"], 99), "warm_p50_s": _pct(d["memory"]["warm"], 50),
                        "errors": len(d["memory"]["errors"]), "refusals": d["memory"]["refusals"]},
        "per_model": [{k: r[k] for k in ("model", "table", "footprint", "pss_growth", "rss_growth", "load_ms")}
                      for r in alone],
    }


def _measures(d: dict, s: dict, rate: float) -> list[dict]:
    load_ms = [r["load_ms"] for r in d["alone"]]
    warm_b, warm_l = _pooled(d["budgeted"], "warm"), _pooled(d["loaded"], "warm")
    cold = [c for c, _ in _pooled(d["budgeted"], "cold")]
    loaded_cold = len(_pooled(d["loaded"], "cold"))
    label = LABELS[d["host"]]
    budget = f"budget {d['budget'] / MiB:.0f} MiB"
    return [
        {"label": f"{label}: every model loaded alone", "concurrency": 1, "batch": 1, "infer_per_s": 0.0,
         "p50_us": _pct(load_ms, 50) * 1e3, "p99_us": _pct(load_ms, 99) * 1e3,
         "note": f"{len(load_ms)} first requests, one at a time, in-process (one load's time)"},
        {"label": f"{label}: all loaded, warm", "concurrency": f"{CLIENTS} clients, open loop", "batch": 1,
         "infer_per_s": rate, "p50_us": _pct(warm_l, 50) * 1e6, "p99_us": _pct(warm_l, 99) * 1e6,
         "note": f"{len(warm_l)} warm ({loaded_cold} cold: the models' first requests were made before)"},
        {"label": f"{label}: {budget}, warm", "concurrency": f"{CLIENTS} clients, open loop", "batch": 1,
         "infer_per_s": rate, "p50_us": _pct(warm_b, 50) * 1e6, "p99_us": _pct(warm_b, 99) * 1e6,
         "note": f"{len(warm_b)} warm; errors {s['errors']}, refused {s['refusals']}"},
        {"label": f"{label}: {budget}, cold", "concurrency": f"{CLIENTS} clients, open loop", "batch": 1,
         "infer_per_s": rate, "p50_us": _pct(cold, 50) * 1e6, "p99_us": _pct(cold, 99) * 1e6,
         "note": (f"{len(cold)} cold ({len(cold) / max(1, len(cold) + len(warm_b)):.0%}); "
                  f"{s['loads_per_s']:.1f} loads/s, {s['evictions_per_s']:.1f} evictions/s")},
    ]


def _notes(summaries: list[dict]) -> str:
    lines = []
    for d in summaries:
        lines += [f"Per model, {LABELS[d['host']]}, each loaded alone (load average {d['loadavg'][0]:.1f} at the "
                  f"start, {d['loadavg'][1]:.1f} at the end; the first model's growth includes the runtime's "
                  "one-time set-up: left out of the 15% count):", "",
                  "| model | table MB | footprint MiB | tree PSS growth MiB | footprint / growth | tree RSS growth MiB "
                  "| load ms |", "|---|---:|---:|---:|---:|---:|---:|"]
        for r in d["per_model"]:
            ratio = r["footprint"] / r["pss_growth"] if r["pss_growth"] > 0 else float("nan")
            lines.append(f"| {r['model']} | {r['table'] / 1e6:.0f} | {r['footprint'] / MiB:.1f} | "
                         f"{r['pss_growth'] / MiB:.1f} | {ratio:.2f} | {r['rss_growth'] / MiB:.1f} | "
                         f"{r['load_ms']:.0f} |")
        lines.append("")
    return "\n".join(lines)


def ratios(result: dict) -> dict:
    out = {}
    for d in result["details"]:
        m = LABELS[d["host"]]
        out[f"{m}: cold p50 / p99 against one load's time (p50 / p99 of the loads alone)"] = (
            f"{d['cold_p50_s'] * 1e3:.0f} / {d['cold_p99_s'] * 1e3:.0f} ms against {d['one_load_p50_s'] * 1e3:.0f} / "
            f"{d['one_load_p99_s'] * 1e3:.0f} ms ({d['cold_count']} cold requests); each cold request over its own "
            f"model's load alone: p50 {d['stretch_p50']:.2f}x, p99 {d['stretch_p99']:.2f}x")
        rounds = ", ".join(f"{b * 1e3:.1f} / {a * 1e3:.1f}" for b, a in d["rounds_p99"])
        out[f"{m}: warm p99 budgeted / all loaded, same paced rate"] = (
            f"median of the rounds' ratios {d['ratio_of_rounds']:.2f}x (rounds, ms: {rounds}); pooled "
            f"{d['warm_p99_budgeted_s'] * 1e3:.1f} / {d['warm_p99_loaded_s'] * 1e3:.1f} ms = "
            f"{d['warm_p99_budgeted_s'] / max(d['warm_p99_loaded_s'], 1e-9):.2f}x; p50 "
            f"{d['warm_p50_budgeted_s'] * 1e3:.2f} / {d['warm_p50_loaded_s'] * 1e3:.2f} ms")
        busy = ", ".join(f"{b * 1e3:.1f} / {a * 1e3:.1f}" for b, a in d["rounds_busy_p99"])
        out[f"{m}: the control: warm p99 all loaded with every core busy at SCHED_IDLE / alone"] = (
            f"pooled {d['warm_p99_busy_s'] * 1e3:.1f} / {d['warm_p99_loaded_s'] * 1e3:.1f} ms = "
            f"{d['warm_p99_busy_s'] / max(d['warm_p99_loaded_s'], 1e-9):.2f}x (rounds, ms: {busy}); p50 "
            f"{d['warm_p50_busy_s'] * 1e3:.2f} / {d['warm_p50_loaded_s'] * 1e3:.2f} ms")
        out[f"{m}: footprints against the tree's growth"] = (
            f"{d['within_15pct']} of {d['compared']} models within 15% (footprint / PSS growth "
            f"{d['ratio_min']:.2f}-{d['ratio_max']:.2f}, median {d['ratio_median']:.2f}); summed: footprints "
            f"{d['footprints'] / MiB:.0f} MiB, PSS growth {d['pss_growth'] / MiB:.0f} MiB, RSS growth "
            f"{d['rss_growth'] / MiB:.0f} MiB, tables {d['tables'] / MiB:.0f} MiB")
        out[f"{m}: loads / evictions per second (budgeted)"] = (
            f"{d['loads_per_s']:.1f} / {d['evictions_per_s']:.1f}; errors {d['errors']}, refusals {d['refusals']}")
        peak, base = d["peak"]
        mem = d["memory_pass"]
        out[f"{m}: peak tree PSS against start-up + budget (the memory pass)"] = (
            f"{peak / MiB:.0f} MiB against {base / MiB:.0f} + {d['budget'] / MiB:.0f} = "
            f"{(base + d['budget']) / MiB:.0f} MiB (every model loaded: {d['pss_loaded'] / MiB:.0f} MiB); "
            f"the pass, sampled: warm p50 / p99 "
            f"{mem['warm_p50_s'] * 1e3:.2f} / {mem['warm_p99_s'] * 1e3:.1f} ms, errors {mem['errors']}, "
            f"refusals {mem['refusals']}")
    return out
