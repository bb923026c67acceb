"""A Python-backend identity model that the test holds open: deterministic in-flight
requests, queues, orders and slow loads, without timing guesses.

``execute`` creates ``<gate>/started.<n>`` (n counts executions from 0 across all the
model's instances, in the order they began; the file holds the first element of each
request's INPUT0, one a line, so a test can tell which requests an execution ran) and
waits for ``<gate>/release`` (then answers OUTPUT0 = INPUT0); with ``hold_load``,
``initialize`` creates ``<gate>/loading.<pid>.<id>`` (loads under way can be counted)
and waits for ``<gate>/loaded`` first; with ``sleep_s``, each execution also sleeps
that long (a known least execution time, for estimates). Waits give up after 120 s.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from repo_builder import add_model, config

_SOURCE = '''
import os
import time

import triton_python_backend_utils as pb_utils

GATE = {gate!r}
HOLD_LOAD = {hold_load!r}
SLEEP_S = {sleep_s!r}


def _wait(path):
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def _started(lines):
    # The next free number: exclusive creation keeps it unique across instances (and module copies).
    n = len([f for f in os.listdir(GATE) if f.startswith("started.")])
    while True:
        try:
            fd = os.open(os.path.join(GATE, "started.%d" % n), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        os.write(fd, "".join(line + "\\n" for line in lines).encode())
        os.close(fd)
        return


class TritonPythonModel:
    def initialize(self, args):
        if HOLD_LOAD:
            open(os.path.join(GATE, "loading.%d.%d" % (os.getpid(), id(self))), "w").close()
            _wait(os.path.join(GATE, "loaded"))

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        _started([repr(float(x.flat[0])) if x.size else "" for x in inputs])
        if SLEEP_S:
            time.sleep(SLEEP_S)
        _wait(os.path.join(GATE, "release"))
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]) for x in inputs]
'''


def add_gated_model(repo: Path, name: str, gate: Path, hold_load: bool = False, *, max_batch_size: int = 0,
                    dims: Sequence[int] = (-1,), count: int = 1, extra: str = "", sleep_s: float = 0.0) -> None:
    """INPUT0 -> OUTPUT0, FP32 ``dims`` (no batching unless ``max_batch_size``), ``count`` instances;
    ``extra`` is more config text (dynamic_batching, parameters)."""
    gate.mkdir(parents=True, exist_ok=True)
    text = config(name, [("INPUT0", "TYPE_FP32", dims)], [("OUTPUT0", "TYPE_FP32", dims)], max_batch_size,
                  platform=None,
                  extra=f'backend: "python"\ninstance_group [ {{ kind: KIND_CPU count: {count} }} ]\n' + extra)
    source = _SOURCE.format(gate=str(gate), hold_load=hold_load, sleep_s=sleep_s).encode()
    add_model(repo, name, source, text, filename="model.py")


def release(gate: Path, what: str = "release") -> None:
    (gate / what).touch()


def reset(gate: Path) -> None:
    """Hold the next executions again, counted from 0. Only while none is executing."""
    (gate / "release").unlink(missing_ok=True)
    for path in gate.glob("started.*"):
        path.unlink()


def loading_count(gate: Path) -> int:
    """How many loads of held models (``hold_load``) sharing ``gate`` have begun their ``initialize``."""
    return len(list(gate.glob("loading.*")))


def started_count(gate: Path) -> int:
    return len(list(gate.glob("started.*")))


def wait_started(gate: Path, count: int = 1, timeout: float = 60) -> None:
    """Until ``count`` executions have begun."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started_count(gate) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} executions did not start within {timeout}s")


async def wait_started_async(gate: Path, count: int = 1, timeout: float = 60) -> None:
    """:func:`wait_started` for a test on an event loop (its clients keep running meanwhile)."""
    deadline = time.monotonic() + timeout
    while started_count(gate) < count:
        assert time.monotonic() < deadline, f"{count} executions did not start within {timeout}s"
        await asyncio.sleep(0.005)


def executions(gate: Path) -> list[list[float]]:
    """The executions begun so far, in order: each the first INPUT0 element of its requests."""
    out = []
    for n in range(started_count(gate)):
        text = (gate / f"started.{n}").read_text()
        out.append([float(line) for line in text.splitlines() if line])
    return out


def pending(metrics_url: str, model: str) -> int:
    """The model's queued requests (nv_inference_pending_request_count) in one scrape of ``metrics_url``."""
    with urllib.request.urlopen(metrics_url, timeout=30) as response:
        text = response.read().decode()
    pattern = rf'^nv_inference_pending_request_count\{{model="{re.escape(model)}",version="1"\}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no nv_inference_pending_request_count for model '{model}'"
    return int(float(match.group(1)))


def wait_pending(metrics_url: str, model: str, count: int, timeout: float = 60) -> None:
    """Until ``count`` requests wait in the model's queue (the test's requests reached the server)."""
    deadline = time.monotonic() + timeout
    while (seen := pending(metrics_url, model)) < count:
        assert time.monotonic() < deadline, f"model '{model}': {seen} of {count} requests queued after {timeout}s"
        time.sleep(0.01)


async def wait_pending_async(metrics_url: str, model: str, count: int, timeout: float = 60) -> None:
    """:func:`wait_pending` for a test on an event loop (the scrape runs on a thread)."""
    deadline = time.monotonic() + timeout
    while (seen := await asyncio.to_thread(pending, metrics_url, model)) < count:
        assert time.monotonic() < deadline, f"model '{model}': {seen} of {count} requests queued after {timeout}s"
        await asyncio.sleep(0.01)
