"""The ``inferd tune`` command: options, the run, and what it prints and writes."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*$")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%?\s*$")
LOAD_GENERATORS = ("inferd", "aiperf")
DEFAULT_WINDOW_MS = {"inferd": 250, "aiperf": 2000}


def duration(default_unit: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        m = _DURATION.match(text)
        if not m:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 20ms, 500us, 10m, 90s)")
        return float(m.group(1)) * _SCALE[m.group(2) or default_unit]
    return parse


def percent(text: str) -> float:
    m = _PERCENT.match(text)
    value = float(m.group(1)) / 100 if m else -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--min-gain takes a percentage between 0 and 100, like 10%, got {text!r}")
    return value


def worker_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--frontend-workers takes counts like 0,2, got {text!r}") from None
    if not counts or any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError(f"--frontend-workers takes counts >= 0 like 0,2, got {text!r}")
    return counts


def add_parser(sub: argparse._SubParsersAction) -> None:
    from inferd.perf.options import parse_concurrency_range, parse_rate_range

    p = sub.add_parser("tune", help="search a model's batching and instance configuration with the load client",
                       description=__doc__)
    p.add_argument("-m", "--model", required=True, help="the model to tune")
    p.add_argument("--model-repository", type=Path, required=True,
                   help="the repository holding it (read for its config; --write changes it there)")
    p.add_argument("-u", "--url", help="a running server in explicit model-control mode (default: start one)")
    p.add_argument("-i", "--protocol", choices=["grpc", "http"], default="grpc")
    p.add_argument("--latency-budget", type=duration("ms"), default=0.020, metavar="DURATION",
                   help="p99 a configuration must keep (default 20ms)")
    p.add_argument("--objective", choices=["throughput", "latency", "cost"], default="throughput",
                   help="throughput: most inferences/s within the budget; latency: lowest p99; "
                        "cost: least server CPU per inference within the budget")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", type=parse_concurrency_range, metavar="START:END:STEP",
                      help="load levels (default 1:16:x2... as 1,2,4,8,16)")
    load.add_argument("--request-rate-range", type=parse_rate_range, metavar="START:END:STEP")
    p.add_argument("--time-budget", type=duration("s"), default=180.0, metavar="DURATION",
                   help="the whole run, verification included (default 3m)")
    p.add_argument("--min-gain", type=percent, default=0.10, metavar="PERCENT",
                   help="the gain a candidate must be ruled out of before 'the current config is best' is said "
                        "(default 10%%)")
    p.add_argument("--seed", type=int, default=0, help="the order among equally near candidates")
    p.add_argument("--frontend-workers", type=worker_counts, metavar="N,M",
                   help="own server only: frontend worker counts to try (default: the server's own choice)")
    p.add_argument("--load-generator", choices=LOAD_GENERATORS, default="inferd",
                   help="inferd: inferd perf's load client; aiperf: NVIDIA AIPerf over KServe v2 HTTP, when "
                        "installed (the aiperf command, or $AIPERF)")
    p.add_argument("-p", "--measurement-interval", type=int, metavar="MS",
                   help="a window of a round: three measured, after one to warm up when the configuration was "
                        "just loaded (default 250; 2000 with aiperf)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                   help="an input's shape for a model with variable dimensions, as inferd perf takes it (repeatable)")
    p.add_argument("--input-data", metavar="PATH|random|zero",
                   help="the requests' data, as inferd perf takes it (default: random)")
    p.add_argument("--out", type=Path, default=Path("tune-out"),
                   help="folder for tune.json, verification.txt, tune.png and the config diff (default tune-out)")
    p.add_argument("--write", action="store_true",
                   help="write the chosen config.pbtxt into the repository once it won its verification "
                        "(the old one kept beside it)")


def _levels(args: argparse.Namespace) -> tuple[str, list[float]]:
    if args.request_rate_range:
        return "request_rate", [float(v) for v in args.request_rate_range]
    if args.concurrency_range:
        return "concurrency", [float(v) for v in args.concurrency_range]
    return "concurrency", [1.0, 2.0, 4.0, 8.0, 16.0]


def _problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options together, or None."""
    if not (args.model_repository / args.model / "config.pbtxt").is_file():
        return (f"model '{args.model}' has no config.pbtxt in {args.model_repository} (tune starts from the "
                "repository's config; write one, or run inferd check to see what it would be)")
    if args.url and args.frontend_workers:
        return "--frontend-workers needs a server started by tune (not -u)"
    if args.url and args.protocol == "http":
        return ("-u with -i http: tune loads each configuration over gRPC, so -u takes the server's gRPC address "
                "(HOST:8001) and the load goes over gRPC too")
    if args.load_generator == "aiperf":
        if args.url:
            return ("--load-generator aiperf needs a server started by tune (not -u): its rounds load over "
                    "KServe v2 HTTP while tune loads the configurations over gRPC")
        if args.request_rate_range:
            return "--load-generator aiperf: tune drives it at concurrency levels only (--concurrency-range)"
    return None


def run(args: argparse.Namespace) -> int:
    """Entry point: 0 with a decision (a verified winner, or the current config is best), 3 with
    none (the report says why), 1 on an error to fix, 2 on bad options."""
    from inferd.config import parse_config_file
    from inferd.errors import InferdError
    from inferd.gpu.inventory import default_inventory
    from inferd.tune.run import TuneError
    from inferd.tune.search import SearchSettings
    from inferd.tune.space import SpaceLimits, current, space, with_workers

    problem = _problem(args)
    if problem:
        print(f"inferd tune: {problem}", file=sys.stderr)
        return 2
    try:
        base = parse_config_file(args.model_repository / args.model / "config.pbtxt", model=args.model)
    except InferdError as exc:
        print(f"inferd tune: {exc.message}", file=sys.stderr)
        return 2
    mode, levels = _levels(args)
    params = {k: v.string_value for k, v in base.parameters.items()}
    workers = tuple(args.frontend_workers) if args.frontend_workers else (None,)
    limits = SpaceLimits(cores=len(os.sched_getaffinity(0)), gpus=len(default_inventory().gpus()),
                         frontend_workers=workers,
                         varlen=params.get("inferd.padding", "").lower() in ("true", "1"))
    candidates = space(base, limits)
    window = args.measurement_interval or DEFAULT_WINDOW_MS[args.load_generator]
    settings = SearchSettings(levels=levels, objective=args.objective, latency_budget_us=args.latency_budget * 1e6,
                              time_budget_s=args.time_budget, seed=args.seed, min_gain=args.min_gain,
                              round_estimate_s=4 * window / 1000 + 0.3, closed_loop=mode == "concurrency")
    print(f"inferd tune: {args.model}: {len(candidates)} candidates, levels {', '.join(f'{v:g}' for v in levels)} "
          f"({mode}), objective {args.objective}, p99 budget {args.latency_budget * 1e3:g} ms, "
          f"time budget {args.time_budget:g} s, load from {args.load_generator}", file=sys.stderr)
    try:
        # With --frontend-workers the current config is measured at the first count listed.
        result, extra = _search(args, base, candidates, settings, mode, levels, window,
                                with_workers(current(base), workers[0]))
    except TuneError as exc:
        print(f"inferd tune: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("inferd tune: interrupted; the servers it started are stopped, nothing written", file=sys.stderr)
        return 130
    return _output(args, base, result, settings, extra)


def _search(args: argparse.Namespace, base: Any, candidates: list, settings: Any, mode: str, levels: list[float],
            window: int, now: Any) -> tuple[Any, dict[str, Any]]:
    from inferd.tune.run import Fleet, InferdRounds, ServerSettings
    from inferd.tune.search import search

    perf_args = [a for shape in args.shape for a in ("--shape", shape)]
    if args.input_data:
        perf_args += ["--input-data", args.input_data]
    fleet = Fleet(ServerSettings(args.model_repository, args.model, args.url,
                                 "http" if args.load_generator == "aiperf" else args.protocol, window, mode=mode,
                                 levels=tuple(levels), perf_args=tuple(perf_args)))
    if args.load_generator == "aiperf":
        from inferd.tune.aiperf import AIPerfRounds

        rounds: Any = AIPerfRounds(fleet, base, args.out / "aiperf")
    else:
        rounds = InferdRounds(fleet, base)
    # SIGTERM (a CI timeout, a kill) ends the run like Ctrl-C, so the servers and load processes
    # started here are stopped on the way out instead of being left behind.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = search(candidates, now, settings, rounds, time.monotonic,
                        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
        rounds.close()
        fleet.stop()
    wall = sum(r.wall_s for r in result.ledger.rounds) or 1.0
    client = sum(r.client_cpu_s for r in result.ledger.rounds)
    return result, {"model": args.model, "client_cores": client / wall, "load_generator": args.load_generator,
                    "window_ms": window}


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _output(args: argparse.Namespace, base: Any, result: Any, settings: Any, extra: dict[str, Any]) -> int:
    from inferd.tune import summary

    args.out.mkdir(parents=True, exist_ok=True)
    print(summary.report(result))
    if not args.url:
        print(f"the load client used {extra['client_cores']:.2f} cores during the rounds, on the machine the server ran on")
    if result.verification is not None:
        (args.out / "verification.txt").write_text(summary.verification_text(result.verification) + "\n")
    print()
    print(summary.decision_line(result))
    chosen = result.recommended
    if chosen is not None:
        tuned = chosen.apply(base)
        diff = summary.config_diff(base, tuned, args.model)
        (args.out / "config.diff").write_text(diff)
        if chosen.frontend_workers is not None:
            print(f"serve with --frontend-workers {chosen.frontend_workers}")
        print(diff or "(the repository's config already is the chosen one)")
        if args.write and diff:
            kept = summary.write_config(args.model_repository / args.model, tuned)
            print(f"wrote {args.model_repository / args.model / 'config.pbtxt'} (the old one is {kept.name})")
    elif args.write:
        print("nothing written: " + ("the current config stays" if result.decision == "current" else "no decision"))
    (args.out / "tune.json").write_text(summary.to_json(result, settings, extra))
    files = [str(args.out / "tune.json")] + ([str(args.out / "verification.txt")] if result.verification else [])
    try:
        summary.plot(result, settings, args.out / "tune.png")
        files.append(str(args.out / "tune.png"))
        print(f"files: {', '.join(files)}")
    except ImportError:
        print(f"files: {', '.join(files)} (no plot: matplotlib is not installed: pip install 'inferd[perf]')")
    return 0 if result.decision in ("winner", "current") else 3
