"""Issue #30: ``max_inflight_requests`` holds the core's memory flat while a fast step feeds a slow
one at ten times its rate, and without it the same traffic grows it; through tritonclient against a
real ``inferd serve`` (both process modes).

``widen`` (a Python model) turns each request's one number into a 1 MiB intermediate tensor; ``drain``
(a Python model, one instance) reads it back to one number, one execution at a time, each held until
the test releases it by number. Each round the test offers ten requests and releases one execution,
so the fast step is offered ten times what the slow one serves. What is measured is the core
process's RSS (the process that holds the intermediate tensors, in either mode), sampled once the
round's requests are all in the server and the fast step has run for every request the limit lets
past it. The bound is generous (the limit lets at most 4 MiB of intermediate tensors live here; the
bound is 20 MiB above the start); without the limit the same rounds hold about 55 MiB at the end.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient

from conftest import ServerProcess, running
from repo_builder import add_python_model, config
from test_ensemble import add_ensemble, steps_text

MiB = 1 << 20
WIDE = MiB // 4  # float32 elements: 1 MiB
LIMIT = 2  # max_inflight_requests of "bounded": 2 steps, so at most 4 requests past its first step
ROUNDS = 6
OFFERED = 10  # requests offered per slow execution
BOUND = 20 * MiB  # the bounded ensemble's core RSS growth, at most
GROWN = 40 * MiB  # the unbounded one's, at least, after the last round (55 intermediate tensors live)

WIDEN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("WIDE", np.full({wide}, x[0], np.float32))]))
        return out
'''

# One execution at a time; the n-th (from 0) waits for <gate>/go.<n>, or for <gate>/release (all).
DRAIN = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = {gate!r}


class TritonPythonModel:
    def initialize(self, args):
        self.n = 0

    def execute(self, requests):
        mine, self.n = self.n, self.n + 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(
                os.path.exists(os.path.join(GATE, f)) for f in ("go.%d" % mine, "release")):
            time.sleep(0.005)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "WIDE").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x[:1] * 1)]))
        return out
'''


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("memory_gates")
    out = {}
    for name in ("bounded", "unbounded"):
        out[name] = root / name
        out[name].mkdir()
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gates: dict[str, Path]):  # type: ignore[no-untyped-def]
    repo = tmp_path_factory.mktemp("memory_repo")
    python = 'backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'
    one, wide = ("INPUT0", "TYPE_FP32", [1]), ("WIDE", "TYPE_FP32", [WIDE])
    add_python_model(repo, "widen", WIDEN.format(wide=WIDE), config("widen", [one], [wide], platform=None, extra=python))
    for name, limit in (("bounded", LIMIT), ("unbounded", 0)):
        drain = f"drain_{name}"
        add_python_model(repo, drain, DRAIN.format(gate=str(gates[name])),
                         config(drain, [wide], [("OUTPUT0", "TYPE_FP32", [1])], platform=None, extra=python))
        steps = [("widen", {"INPUT0": "INPUT0"}, {"WIDE": "wide"}), (drain, {"WIDE": "wide"}, {"OUTPUT0": "OUTPUT0"})]
        add_ensemble(repo, name, config(name, [one], [("OUTPUT0", "TYPE_FP32", [1])], platform="ensemble",
                                        extra=steps_text(steps, limit)))
    with running(repo) as srv:
        yield srv


def _core_rss(server: ServerProcess) -> int:
    """The RSS of the core process (``inferd serve`` itself: it holds the models and the tensors)."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _inflight(server: ServerProcess, model: str) -> int:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf'^inferd_inference_inflight_request_count\{{model="{model}",version="1"\}} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else 0


async def _until(what: str, check) -> None:  # type: ignore[no-untyped-def]
    """Until ``check()`` (run on a thread) is true; 60 s bounds a hang, it is not a timing claim."""
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(check):
        assert time.monotonic() < deadline, f"not reached within 60 s: {what}"
        await asyncio.sleep(0.01)


async def _offer(server: ServerProcess, ensemble: str, gate: Path, places: int | None) -> list[int]:
    """The rounds against ``ensemble``: the core's RSS growth after each. ``places``: how many
    requests may be past the fast step at once (None: no limit)."""
    client = aioclient.InferenceServerClient(server.url)

    def widened() -> int:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(server.url) as c:
            return int(c.get_inference_statistics("widen").model_stats[0].inference_count)

    async def one(i: int) -> np.ndarray:
        x = aioclient.InferInput("INPUT0", [1], "FP32")
        x.set_data_from_numpy(np.array([i], np.float32))
        return (await client.infer(ensemble, [x])).as_numpy("OUTPUT0")

    calls: list[asyncio.Future] = []
    growth = []
    try:
        start, widened_before = _core_rss(server), widened()
        for r in range(ROUNDS):
            first = len(calls)
            calls += [asyncio.ensure_future(one(first + k)) for k in range(OFFERED)]
            sent, done = len(calls), r
            passed = sent if places is None else min(sent, done + places)
            await _until(f"round {r}: {sent - done} requests in '{ensemble}'",
                         lambda: _inflight(server, ensemble) == sent - done)
            await _until(f"round {r}: the fast step ran for {passed} requests",
                         lambda: widened() - widened_before >= passed)
            assert widened() - widened_before == passed, f"round {r}: more requests passed the fast step than allowed"
            growth.append(_core_rss(server) - start)
            (gate / f"go.{r}").touch()  # one slow execution
            await _until(f"round {r}: {r + 1} answered", lambda: sum(c.done() for c in calls) == r + 1)
    finally:
        (gate / "release").touch()
        results = await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
    failed = [x for x in results if isinstance(x, BaseException)]
    assert not failed, failed[:3]
    assert [float(x.flat[0]) for x in results] == [float(i) for i in range(len(calls))]  # type: ignore[union-attr]
    return growth


async def test_max_inflight_requests_holds_the_core_memory_flat(server, gates):
    growth = await _offer(server, "bounded", gates["bounded"], places=2 * LIMIT)
    print("bounded: core RSS growth per round (MiB):", [round(g / MiB, 1) for g in growth])
    assert max(growth) < BOUND, f"core RSS grew {max(growth) / MiB:.1f} MiB (bound {BOUND / MiB:.0f} MiB): {growth}"


async def test_without_the_limit_the_same_traffic_grows_it(server, gates):
    """The control: the measurement sees the intermediate tensors pile up before the slow step."""
    growth = await _offer(server, "unbounded", gates["unbounded"], places=None)
    print("unbounded: core RSS growth per round (MiB):", [round(g / MiB, 1) for g in growth])
    assert growth[-1] > GROWN, f"core RSS grew only {growth[-1] / MiB:.1f} MiB: {growth}"
    assert growth[-1] > growth[0] + 30 * MiB  # growing round after round (9 MiB each), not once
