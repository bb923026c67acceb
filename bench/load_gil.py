"""What part of an on_demand load holds the GIL, and for how long the event loop waits for it (issue 28).

A ticker on an asyncio loop sleeps 1 ms at a time and records how late it wakes (the loop's lag), first
with nothing else running, then while a second thread repeats one piece of a model load back to back.
A piece that releases the GIL leaves the lag as it was; one that holds it delays the ticker for up to
its own length, or for CPython's switch interval (``sys.getswitchinterval()``, 5 ms by default: a
thread waiting for the GIL asks its holder to drop it only after that long) when the holder runs
without a pause. The model is the table model of the residency scenarios
(inferd/examples/many_models.py, 2 MB of initializer) unless ``--floats`` says otherwise.

    python -m bench.load_gil [--seconds 2] [--floats 500000] [--pause-us 0] [--switch-ms 5]

The machine is shared: compare the rows of one run, not microseconds across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np


def _sessions(path: str, saved: str, label: str) -> dict[str, Callable[[], object]]:
    """A model file's whole session builds: as it is, and from its optimised copies (ORT format and
    ONNX, written once here) with optimisation off, as a cache of them would load it."""
    import onnxruntime as ort

    def options(level: str = "ORT_ENABLE_ALL", keep: str | None = None) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if keep:
            so.optimized_model_filepath = keep
        return so

    for suffix in (".ort", ".onnx"):
        ort.InferenceSession(path, options(keep=saved + suffix), providers=["CPUExecutionProvider"])

    def build(file: str, level: str) -> Callable[[], object]:
        return lambda: ort.InferenceSession(file, options(level), providers=["CPUExecutionProvider"])

    return {
        f"{label}: session, ORT_ENABLE_ALL": build(path, "ORT_ENABLE_ALL"),
        f"{label}: session, ORT_DISABLE_ALL": build(path, "ORT_DISABLE_ALL"),
        f"{label}: optimised ORT format, ORT_DISABLE_ALL": build(saved + ".ort", "ORT_DISABLE_ALL"),
        f"{label}: optimised ONNX, ORT_DISABLE_ALL": build(saved + ".onnx", "ORT_DISABLE_ALL"),
    }


def _pieces(folder: Path, floats: int) -> dict[str, Callable[[], object]]:
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state as C

    from inferd.examples.many_models import add_table_model
    from inferd.repository.manager import prepare
    from inferd.repository.build import build_model

    model_dir = add_table_model(folder, "t00", 0, floats)
    path = str(model_dir / "1" / "model.onnx")
    ort_path = str(folder / "t00.ort")

    def options(level: str = "ORT_ENABLE_ALL") -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        return so

    saved = options()
    saved.optimized_model_filepath = ort_path  # ".ort": ORT format
    ort.InferenceSession(path, saved, providers=["CPUExecutionProvider"])
    data = Path(path).read_bytes()
    parsed: list = []

    def parse() -> object:
        parsed[:] = [C.InferenceSession(options(), path, True, False)]  # one kept for initialize
        return parsed[0]

    def initialize() -> None:
        sess = parsed.pop() if parsed else C.InferenceSession(options(), path, True, False)
        sess.initialize_session(["CPUExecutionProvider"], [], set())

    prepared = prepare("t00", model_dir)

    def python_spin() -> None:  # 2 ms of pure Python: what any Python on the loader costs the loop
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass

    return {
        "read the file (open/read)": lambda: Path(path).read_bytes(),
        "pure Python, 2 ms a piece": python_spin,
        "session: C.InferenceSession (parse only)": parse,
        "session: initialize_session (after a parse)": initialize,
        "session: whole, ORT_ENABLE_ALL, from path": lambda: ort.InferenceSession(
            path, options(), providers=["CPUExecutionProvider"]),
        "session: whole, ORT_DISABLE_ALL, from path": lambda: ort.InferenceSession(
            path, options("ORT_DISABLE_ALL"), providers=["CPUExecutionProvider"]),
        "session: whole, ORT_ENABLE_ALL, from bytes": lambda: ort.InferenceSession(
            data, options(), providers=["CPUExecutionProvider"]),
        "session: ORT format, ORT_DISABLE_ALL": lambda: ort.InferenceSession(
            ort_path, options("ORT_DISABLE_ALL"), providers=["CPUExecutionProvider"]),
        "inferd: prepare (config, signature)": lambda: prepare("t00", model_dir),
        "inferd: build_model (instance, scheduler)": lambda: build_model(
            prepared.spec, prepared.backend, model_dir, 1, Path(path)),
    }


async def _ticker(seconds: float) -> list[float]:
    lags = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t - 0.001) * 1e6)
    return lags


def _phase(piece: Callable[[], object] | None, seconds: float, pause: float) -> tuple[list[float], list[float]]:
    stop = threading.Event()
    durations: list[float] = []

    def repeat() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            piece()  # type: ignore[misc]
            durations.append((time.perf_counter() - t) * 1e6)
            if pause:
                time.sleep(pause)  # blocks without the GIL: a thread waiting for it takes it now

    thread = threading.Thread(target=repeat, daemon=True) if piece is not None else None
    if thread is not None:
        thread.start()
    try:
        lags = asyncio.run(_ticker(seconds))
    finally:
        stop.set()
        if thread is not None:
            thread.join()
    return lags, durations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_gil", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="per row")
    parser.add_argument("--floats", type=int, default=500_000, help="the table model's size (4 bytes each)")
    parser.add_argument("--pause-us", type=float, default=0.0,
                        help="the loader thread sleeps this long between pieces (default 0: back to back)")
    parser.add_argument("--model", type=Path, action="append", default=[],
                        help="also time whole session builds of this .onnx file (repeatable)")
    parser.add_argument("--only-models", action="store_true", help="only the --model rows")
    parser.add_argument("--switch-ms", type=float, default=None, help="sys.setswitchinterval for the run (ms)")
    args = parser.parse_args(argv)
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms * 1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        pieces = {} if args.only_models else _pieces(Path(tmp), args.floats)
        for i, model in enumerate(args.model):
            pieces.update(_sessions(str(model), str(Path(tmp) / f"saved{i}"), model.parent.parent.name or model.stem))
        print(f"switch interval {sys.getswitchinterval() * 1e3:.1f} ms; pause between pieces {args.pause_us:.0f} us; "
              "loop lag of a 1 ms sleep, us")
        print(f"{'beside the loop':46} {'p50':>7} {'p99':>7} {'max':>7}  {'piece mean us':>13}")
        rows: list[tuple[str, Callable[[], object] | None]] = [("nothing", None), *pieces.items()]
        for label, piece in rows:
            lags, durations = _phase(piece, args.seconds, args.pause_us * 1e-6)
            mean = f"{np.mean(durations):13.0f}" if durations else f"{'':13}"
            print(f"{label:46} {np.percentile(lags, 50):7.0f} {np.percentile(lags, 99):7.0f} "
                  f"{max(lags):7.0f}  {mean}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
