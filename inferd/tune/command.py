"""The ``inferd tune`` command: options, the run, and what it prints and writes."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)?\s*$")
_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(default_unit: str) -> "callable":  # type: ignore[valid-type]
    def parse(text: str) -> float:
        m = _DURATION.match(text)
        if not m:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 20ms, 500us, 10m, 90s)")
        return float(m.group(1)) * _SCALE[m.group(2) or default_unit]
    return parse


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
                        "cost: most inferences per server CPU-second within the budget")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", type=parse_concurrency_range, metavar="START:END:STEP",
                      help="load levels (default 1:16:x2... as 1,2,4,8,16)")
    load.add_argument("--request-rate-range", type=parse_rate_range, metavar="START:END:STEP")
    p.add_argument("--time-budget", type=duration("s"), default=600.0, metavar="DURATION",
                   help="stop measuring after this long (default 10m)")
    p.add_argument("--seed", type=int, default=0, help="the sample of a space larger than the budget")
    p.add_argument("--frontend-workers", type=worker_counts, metavar="N,M",
                   help="own server only: frontend worker counts to try (default: the server's own choice)")
    p.add_argument("-p", "--measurement-interval", type=int, default=2000, metavar="MS",
                   help="the load client's window (default 2000)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                   help="an input's shape for a model with variable dimensions, as inferd perf takes it (repeatable)")
    p.add_argument("--input-data", metavar="PATH|random|zero",
                   help="the requests' data, as inferd perf takes it (default: random)")
    p.add_argument("--out", type=Path, default=Path("tune-out"),
                   help="folder for tune.json, tune.png and the config diff (default tune-out)")
    p.add_argument("--write", action="store_true",
                   help="write the chosen config.pbtxt into the repository (the old one kept beside it)")


def _levels(args: argparse.Namespace) -> tuple[str, list[float]]:
    if args.request_rate_range:
        return "request_rate", [float(v) for v in args.request_rate_range]
    if args.concurrency_range:
        return "concurrency", [float(v) for v in args.concurrency_range]
    return "concurrency", [1.0, 2.0, 4.0, 8.0, 16.0]


def run(args: argparse.Namespace) -> int:
    from inferd.config import parse_config_file
    from inferd.errors import InferdError
    from inferd.tune import summary
    from inferd.tune.run import Measurer, Server, ServerSettings, TuneError
    from inferd.tune.search import SearchSettings, search
    from inferd.tune.space import Candidate, SpaceLimits, current, space, with_workers

    model_dir = args.model_repository / args.model
    if not (model_dir / "config.pbtxt").is_file():
        print(f"inferd tune: model '{args.model}' has no config.pbtxt in {args.model_repository} "
              "(tune starts from the repository's config; write one, or run inferd check to see what it would be)",
              file=sys.stderr)
        return 2
    if args.url and args.frontend_workers:
        print("inferd tune: --frontend-workers needs a server started by tune (not -u)", file=sys.stderr)
        return 2
    try:
        base = parse_config_file(model_dir / "config.pbtxt", model=args.model)
    except InferdError as exc:
        print(f"inferd tune: {exc.message}", file=sys.stderr)
        return 2
    mode, levels = _levels(args)
    params = {k: v.string_value for k, v in base.parameters.items()}
    workers = tuple(args.frontend_workers) if args.frontend_workers else (None,)
    from inferd.gpu.inventory import default_inventory

    limits = SpaceLimits(cores=len(os.sched_getaffinity(0)), gpus=len(default_inventory().gpus()),
                         frontend_workers=workers,
                         varlen=params.get("inferd.padding", "").lower() in ("true", "1"))
    candidates = space(base, limits)
    now = current(base)
    reference = [with_workers(now, w) for w in workers] + [with_workers(Candidate(batching=False), w) for w in workers]
    settings = SearchSettings(levels=levels, objective=args.objective, latency_budget_us=args.latency_budget * 1e6,
                              time_budget_s=args.time_budget, seed=args.seed,
                              estimate_s=max(1.0, 3 * args.measurement_interval / 1000))
    perf_args = [a for shape in args.shape for a in ("--shape", shape)]
    if args.input_data:
        perf_args += ["--input-data", args.input_data]
    server = Server(ServerSettings(args.model_repository, args.model, args.url, args.protocol,
                                   args.measurement_interval, mode=mode, perf_args=tuple(perf_args)))
    print(f"inferd tune: {args.model}: {len(candidates)} candidates, levels {', '.join(f'{v:g}' for v in levels)} "
          f"({mode}), objective {args.objective}, p99 budget {args.latency_budget * 1e3:g} ms, "
          f"time budget {args.time_budget:g} s", file=sys.stderr)
    try:
        result = search(candidates, settings, Measurer(server, base, server.settings), time.monotonic, reference)
    except TuneError as exc:
        print(f"inferd tune: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    client_cpu = sum(m.client_cpu_s for m in result.measurements)
    wall = sum(m.wall_s for m in result.measurements) or 1.0
    print(summary.table(result.measurements))
    print(f"\n{len(result.measurements)} measurements of {result.sampled} sampled candidates (the model allows "
          f"{result.space}) in {result.elapsed_s:.0f} s"
          f"{' (stopped by the time budget)' if result.stopped_by_budget else ''}; "
          f"the load client used {client_cpu / wall:.2f} cores meanwhile, on the machine the server ran on"
          if not args.url else "")
    extra = {"model": args.model, "client_cores": client_cpu / wall}
    chosen = result.recommended
    if chosen is None:
        print(f"no recommendation: {result.reason}")
    else:
        tuned = chosen.apply(base)
        diff = summary.config_diff(base, tuned, args.model)
        (args.out / "config.diff").write_text(diff)
        print(f"chosen: {chosen.label()} ({result.reason})")
        if chosen.frontend_workers is not None:
            print(f"serve with --frontend-workers {chosen.frontend_workers}")
        print(diff or "(the repository's config already is the chosen one)")
        if args.write and diff:
            kept = summary.write_config(model_dir, tuned)
            print(f"wrote {model_dir / 'config.pbtxt'} (the old one is {kept.name})")
    (args.out / "tune.json").write_text(summary.to_json(result, settings, extra))
    try:
        summary.plot(result, settings, args.out / "tune.png")
        print(f"figures: {args.out / 'tune.json'}, plot: {args.out / 'tune.png'}")
    except ImportError:
        print(f"figures: {args.out / 'tune.json'} (no plot: matplotlib is not installed: pip install 'inferd[perf]')")
    return 0 if chosen is not None else 3
