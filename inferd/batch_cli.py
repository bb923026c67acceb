"""``inferd batch``: batch jobs from the command line.

- ``inferd batch run FILE -m MODEL --model-repository DIR``: in this process,
  no server (a laptop): loads the model, runs every line of FILE with a
  progress bar (count, rate, ETA), writes each result as it comes to OUT
  (Parquet parts in a folder when pyarrow is installed, else JSONL), and
  resumes where it stopped when run again with the same OUT.
- ``inferd batch submit FILE -m MODEL`` / ``status ID`` / ``results ID`` /
  ``cancel ID`` / ``list``: the same jobs on a running server, over its HTTP
  API (``--url``, default localhost:8000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch", help="batch jobs: run a file of requests in-process, or on a server",
                       description="A file of KServe v2 inference requests (JSONL, one per line, each with a "
                                   "'custom_id'), run at the lowest priority on idle capacity; results per custom id.")
    commands = p.add_subparsers(dest="batch_command", required=True)
    run = commands.add_parser("run", help="run FILE in this process (no server), resumable")
    run.add_argument("file", type=Path, help="the requests (JSONL)")
    run.add_argument("-m", "--model", required=True)
    run.add_argument("--model-version", type=int, default=0, help="default: as the model's version policy chooses")
    run.add_argument("--model-repository", "--model-store", action="append", type=Path, required=True,
                     dest="model_repository", metavar="DIR", help="model repository folder (repeatable)")
    run.add_argument("-o", "--output", type=Path, default=None,
                     help="results: a folder of Parquet files, or a .jsonl file (default: next to FILE)")
    run.add_argument("--format", choices=["parquet", "jsonl"], default=None,
                     help="default: parquet when pyarrow is installed, else jsonl")
    run.add_argument("--window", type=int, default=64, help="requests in flight at once (default 64)")
    submit = commands.add_parser("submit", help="start a job on a server (POST /v2/batches)")
    submit.add_argument("file", type=Path)
    submit.add_argument("-m", "--model", required=True)
    submit.add_argument("--model-version", type=int, default=0)
    for name, what in (("status", "a job's status and counts"), ("cancel", "stop a job, keep its results"),
                       ("results", "a job's results")):
        cmd = commands.add_parser(name, help=what)
        cmd.add_argument("job", help="the job's id (batch_...)")
        if name == "results":
            cmd.add_argument("-o", "--output", type=Path, default=None, help="write here (default: stdout)")
            cmd.add_argument("--format", choices=["jsonl", "npz"], default="jsonl")
    listing = commands.add_parser("list", help="every job of a server")
    for cmd in (submit, listing, *[commands.choices[n] for n in ("status", "cancel", "results")]):
        cmd.add_argument("--url", default="localhost:8000", help="the server's HTTP address (default localhost:8000)")


def main(args: argparse.Namespace) -> int:
    if args.batch_command == "run":
        return _run(args)
    try:
        return _remote(args)
    except (urllib.error.URLError, OSError) as exc:
        print(f"inferd batch: cannot reach the server at {args.url}: {exc}", file=sys.stderr)
        return 1


# -- on a server -------------------------------------------------------------------------


def _remote(args: argparse.Namespace) -> int:
    base = f"http://{args.url}/v2/batches"
    command = args.batch_command
    if command == "submit":
        query = {"model": args.model, **({"model_version": str(args.model_version)} if args.model_version else {})}
        code, body = _http("POST", f"{base}?{urllib.parse.urlencode(query)}", args.file.read_bytes())
    elif command == "list":
        code, body = _http("GET", base)
    elif command == "status":
        code, body = _http("GET", f"{base}/{args.job}")
    elif command == "cancel":
        code, body = _http("POST", f"{base}/{args.job}/cancel")
    else:
        code, body = _http("GET", f"{base}/{args.job}/results?format={args.format}")
        if code == 200:
            if args.output is None:
                sys.stdout.buffer.write(body)
            else:
                args.output.write_bytes(body)
            return 0
    if code != 200:
        message = json.loads(body).get("error", body.decode()) if body.startswith(b"{") else body.decode()
        print(f"inferd batch {command}: {message}", file=sys.stderr)
        return 1
    print(json.dumps(json.loads(body), indent=1))
    return 0


def _http(method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- in this process -------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from inferd.batchjobs import JsonlResults, ParquetResults, parquet_available, parse_lines, remaining
    from inferd.errors import InferdError

    fmt = args.format or ("parquet" if parquet_available() else "jsonl")
    if fmt == "parquet" and not parquet_available():
        print("inferd batch run: --format parquet needs pyarrow (pip install pyarrow)", file=sys.stderr)
        return 2
    output = args.output or args.file.with_name(args.file.stem + (".results" if fmt == "parquet" else ".results.jsonl"))
    try:
        lines = parse_lines(args.file.read_bytes(), str(args.file))
    except (OSError, InferdError) as exc:
        print(f"inferd batch run: {exc}", file=sys.stderr)
        return 2
    writer: Any = ParquetResults(output) if fmt == "parquet" else JsonlResults(output)
    todo = remaining(lines, writer.done())
    if not todo:
        print(f"inferd batch run: nothing to do: all {len(lines)} requests have results in {output}", file=sys.stderr)
        writer.close()
        return 0
    if len(todo) < len(lines):
        print(f"inferd batch run: resuming: {len(lines) - len(todo)} of {len(lines)} requests already have results "
              f"in {output}", file=sys.stderr)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        progress = asyncio.run(_run_lines(args, lines, len(todo), writer))
    except KeyboardInterrupt:
        writer.close()
        print(f"\ninferd batch run: interrupted; the results so far are in {output}: run the same command to resume",
              file=sys.stderr)
        return 130
    except InferdError as exc:
        writer.close()
        print(f"inferd batch run: {exc}", file=sys.stderr)
        return 1
    writer.close()
    print(f"inferd batch run: {progress.succeeded} succeeded, {progress.failed} failed; results in {output}",
          file=sys.stderr)
    return 0


async def _run_lines(args: argparse.Namespace, lines: list, todo: int, writer: Any) -> Any:  # type: ignore[type-arg]
    from tqdm import tqdm

    from inferd.batchjobs import Progress, run_lines
    from inferd.clock import MonotonicClock
    from inferd.dataplane.batches import run_line
    from inferd.repository.manager import READY, ModelManager

    clock = MonotonicClock()
    manager = ModelManager(list(args.model_repository), mode="explicit", startup_models=[args.model])
    await manager.load_all()
    try:
        broken = [e for e in manager.index() if e.name == args.model and e.state != READY]
        if broken:
            from inferd.errors import Unavailable

            raise Unavailable(f"model '{args.model}' did not load: {broken[0].reason or broken[0].state}")
        with tqdm(total=todo, unit="req", file=sys.stderr, dynamic_ncols=True, mininterval=0.2) as bar:
            async def infer(line: Any) -> Any:
                return await run_line(manager.get, clock, args.model, args.model_version, line)

            return await run_lines(lines, writer, infer, progress=Progress(total=len(lines)), window=args.window,
                                   clock=clock, on_result=lambda result: bar.update(1))
    finally:
        await manager.stop()
