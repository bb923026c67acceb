"""The on_demand driver in one process (inferd/repository/demand.py, dataplane/cold.py): a failed load
answers every waiter with its reason, a request's timeout bounds its wait for a held load, a cold
request on the callback path can be cancelled while the load goes on, and cold waits are left out of
the queue-delay controller."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from gated_model import add_gated_model, release  # noqa: E402

from inferd.dataplane import DataPlane  # noqa: E402
from inferd.errors import InferdError, Unavailable  # noqa: E402
from inferd.examples.many_models import add_table_model, expected  # noqa: E402
from inferd.repository import ModelManager  # noqa: E402
from inferd.types import InferenceRequest  # noqa: E402


def table_request(name: str, i: int = 3, **kw) -> InferenceRequest:  # type: ignore[no-untyped-def]
    return InferenceRequest(model_name=name, inputs={"I": np.array([i], dtype=np.int64)}, **kw)


async def plane(repo: Path) -> DataPlane:
    dp = DataPlane(ModelManager([repo], mode="on_demand"))
    await dp.load_models()
    return dp


async def test_a_failed_load_answers_every_waiting_request_with_its_reason(tmp_path: Path) -> None:
    add_table_model(tmp_path, "broken", 0, 10)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    dp = await plane(tmp_path)
    try:
        results = await asyncio.gather(*(dp.infer(table_request("broken")) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, InferdError) for r in results), results
        assert {str(r).split(":")[0] for r in results} == {"model 'broken' failed to load on demand"}
        assert dp.manager.demand.counters["broken"].load_failures == 1  # one load for the three
        (entry,) = [e for e in dp.manager.index() if e.name == "broken"]
        assert entry.state == "UNAVAILABLE" and "failed to load on demand" in entry.reason
    finally:
        await dp.close()


async def test_a_request_timeout_bounds_its_wait_for_a_held_load(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "held", gate, hold_load=True, dims=(1,))
    dp = await plane(tmp_path / "repo")
    try:
        request = InferenceRequest(model_name="held", inputs={"INPUT0": np.ones(1, np.float32)}, timeout_us=50_000)
        with pytest.raises(Unavailable, match="request timed out while the model loaded on demand"):
            await dp.infer(request)
        release(gate, "loaded")
        release(gate)
        done = await dp.infer(InferenceRequest(model_name="held", inputs={"INPUT0": np.full(1, 2, np.float32)}))
        assert float(done.outputs["OUTPUT0"][0]) == 2.0
        assert dp.manager.demand.counters["held"].loads == 1
    finally:
        release(gate, "loaded")
        release(gate)
        await dp.close()


async def test_a_cold_callback_request_cancelled_during_the_load(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "held", gate, hold_load=True, dims=(1,))
    dp = await plane(tmp_path / "repo")
    ends: list[object] = []
    try:
        run = dp.submit(InferenceRequest(model_name="held", inputs={"INPUT0": np.ones(1, np.float32)}), ends.append)
        await asyncio.sleep(0.05)  # it waits for the load (held by the gate)
        assert ends == [] and not run.finished
        run.cancel()
        assert len(ends) == 1 and isinstance(ends[0].error, asyncio.CancelledError)  # type: ignore[attr-defined]
        await asyncio.sleep(0)  # the cancelled wait's task ends on the next turn
        await asyncio.sleep(0)
        assert dp.admission.requests == 0  # its bytes released with it
        release(gate, "loaded")
        release(gate)
        second: list[object] = []
        run2 = dp.submit(InferenceRequest(model_name="held", inputs={"INPUT0": np.full(1, 5, np.float32)}),
                         second.append)
        for _ in range(2000):
            if second:
                break
            await asyncio.sleep(0.005)
        assert second and second[0].error is None  # type: ignore[attr-defined]
        assert float(second[0].outputs["OUTPUT0"][0]) == 5.0  # type: ignore[attr-defined]
        assert run2.finished or second
    finally:
        release(gate, "loaded")
        release(gate)
        await dp.close()


async def test_cold_waits_do_not_feed_the_queue_delay_controller(tmp_path: Path) -> None:
    add_table_model(tmp_path, "t", 4, 1000)
    dp = await plane(tmp_path)
    try:
        import time

        request = table_request("t", received_ns=time.monotonic_ns())
        response = await dp.infer(request)
        assert float(response.outputs["Y"][0]) == expected(4, 3)
        assert request.load_wait_ns > 0  # its cold start, recorded
        assert dp.manager.demand.counters["t"].misses == 1
        await dp.infer(table_request("t"))
        assert dp.manager.demand.counters["t"].hits == 1
    finally:
        await dp.close()


async def test_a_model_just_loaded_for_a_request_is_the_freshest_not_the_coldest(tmp_path: Path) -> None:
    from inferd.repository.footprint import file_bytes

    for i in range(3):
        add_table_model(tmp_path, f"t{i}", i, 100_000)
    per_model = file_bytes(tmp_path / "t0")
    dp = DataPlane(ModelManager([tmp_path], mode="on_demand", memory_budget=4 * per_model))
    await dp.load_models()
    demand = dp.manager.demand
    evicted: list[str] = []
    evict = demand._evict

    async def recording(name: str) -> None:
        evicted.append(name)
        await evict(name)

    demand._evict = recording  # type: ignore[method-assign]
    try:
        # t0 is used twice, then t1 loads (its use the latest): t2's load must evict t0 first, not t1.
        for name in ("t0", "t0", "t1", "t2"):
            await dp.infer(table_request(name))
        assert evicted[:1] == ["t0"], (evicted, demand.footprints)  # the least recently used went first
    finally:
        await dp.close()
