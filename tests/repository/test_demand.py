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
    from inferd.backends.base import file_bytes

    for i in range(3):
        add_table_model(tmp_path, f"t{i}", i, 1_000_000)
    per_model = file_bytes(tmp_path / "t0")  # 4 MB; a load measures that and ~0.2 MiB (t0: ~1 MiB more, the runtime)
    dp = DataPlane(ModelManager([tmp_path], mode="on_demand", memory_budget=int(2.5 * per_model)))
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


# -- a failed load is remembered (backoff), on a fake clock -----------------------------------


def _broken_same_size(folder: Path) -> bytes:
    """Replace the model file by garbage of the same size; return the good bytes."""
    good = (folder / "1" / "model.onnx").read_bytes()
    (folder / "1" / "model.onnx").write_bytes(b"x" * len(good))
    return good


async def test_a_failed_load_is_not_retried_before_its_backoff_passes(tmp_path: Path) -> None:
    from inferd.clock import FakeClock

    folder = add_table_model(tmp_path, "broken", 0, 10)
    _broken_same_size(folder)
    dp = await plane(tmp_path)
    demand = dp.manager.demand
    clock = demand.clock = FakeClock()
    counters = lambda: demand.counters["broken"]  # noqa: E731
    try:
        with pytest.raises(InferdError, match="(?s)model 'broken' failed to load on demand: .*tried again on a "
                                              "request after 1 s"):
            await dp.infer(table_request("broken"))
        assert counters().load_failures == 1
        for _ in range(3):  # answered at once, with the reason and when it is tried again: no load
            with pytest.raises(InferdError) as info:
                await dp.infer(table_request("broken"))
            assert "failed to load on demand 0.0 s ago" in info.value.message
            assert "not loaded again for 1.0 s (failure 1 in a row" in info.value.message
        assert counters().load_failures == 1 and counters().backoffs == 3
        clock.advance(1.0)  # the backoff passed: loaded again, fails again, the wait doubles
        with pytest.raises(InferdError, match="after 2 s"):
            await dp.infer(table_request("broken"))
        assert counters().load_failures == 2
        clock.advance(1.5)
        with pytest.raises(InferdError, match=r"not loaded again for 0\.5 s \(failure 2 in a row"):
            await dp.infer(table_request("broken"))
        for _ in range(6):  # failures in a row: 2, 4, ... up to 60 s, never more
            clock.advance(60.0)
            with pytest.raises(InferdError):
                await dp.infer(table_request("broken"))
        assert demand.failures["broken"].retry_at - clock.now() == 60.0
        assert counters().load_failures == 8
        (entry,) = [e for e in dp.manager.index() if e.name == "broken"]
        assert entry.state == "UNAVAILABLE" and "tried again on a request after 60 s" in entry.reason
    finally:
        await dp.close()


async def test_changed_files_or_an_explicit_load_end_the_backoff(tmp_path: Path) -> None:
    import os

    from inferd.clock import FakeClock

    folder = add_table_model(tmp_path, "broken", 5, 10)
    good = _broken_same_size(folder)
    other = add_table_model(tmp_path, "other", 6, 10)
    good_other = _broken_same_size(other)
    dp = await plane(tmp_path)
    demand = dp.manager.demand
    demand.clock = FakeClock()
    model_file = folder / "1" / "model.onnx"
    try:
        with pytest.raises(InferdError, match="failed to load on demand"):
            await dp.infer(table_request("broken"))
        # Fixed in place with the same size and modification time: nothing tells, it stays refused ...
        st = model_file.stat()
        model_file.write_bytes(good)
        os.utime(model_file, ns=(st.st_atime_ns, st.st_mtime_ns))
        with pytest.raises(InferdError, match="not loaded again for"):
            await dp.infer(table_request("broken"))
        # ... until RepositoryModelLoad asks: tried at once (and pinned).
        await dp.load_model("broken")
        assert float((await dp.infer(table_request("broken", 2))).outputs["Y"][0]) == expected(5, 2)
        assert "broken" not in demand.failures

        # Another broken model whose files then change: the next request loads it at once.
        with pytest.raises(InferdError, match="failed to load on demand"):
            await dp.infer(table_request("other"))
        other_file = other / "1" / "model.onnx"
        st = other_file.stat()
        other_file.write_bytes(good_other)
        os.utime(other_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert float((await dp.infer(table_request("other", 4))).outputs["Y"][0]) == expected(6, 4)
        assert demand.counters["other"].load_failures == 1 and demand.counters["other"].backoffs == 0
    finally:
        await dp.close()


# -- --model-gpu-memory-budget through the driver, with fake GPU footprints -------------------


def _fake_gpu_footprints(manager: ModelManager, gpu_mb: dict[str, int]) -> None:
    """Each build of a model named in ``gpu_mb`` reports that many MiB on GPU 0 (as torch's allocator
    delta would, in ModelStatistics' memory_usage), which is what the driver reads."""
    build = manager._build_version

    def with_gpu(name, *args):  # type: ignore[no-untyped-def]
        model = build(name, *args)
        if name in gpu_mb:
            host = tuple(u for u in model.stats.memory_usage if u[0] != "GPU")
            model.stats.memory_usage = host + (("GPU", 0, gpu_mb[name] * 2**20),)
        return model

    manager._build_version = with_gpu  # type: ignore[method-assign]


async def test_a_gpu_budget_evicts_models_on_that_gpu_and_refuses_naming_it(tmp_path: Path) -> None:
    from inferd.errors import ResourceExhausted

    for i, name in enumerate(("cpu", "g0", "g1", "g2", "big")):
        add_table_model(tmp_path, name, i, 10)
    manager = ModelManager([tmp_path], mode="on_demand", gpu_memory_budget={0: 100 * 2**20})
    _fake_gpu_footprints(manager, {"g0": 40, "g1": 40, "g2": 40, "big": 120})
    dp = DataPlane(manager)
    await dp.load_models()
    demand = manager.demand
    loaded = lambda: {e.name for e in manager.index() if e.state == "READY"}  # noqa: E731
    try:
        for name in ("cpu", "g0", "g1"):
            await dp.infer(table_request(name))
        assert demand.gpu_used() == {0: 80 * 2**20}
        # g2's GPU footprint is not known before its first load: it loads, then the coldest model on
        # GPU 0 goes (the host-only model, colder still, stays).
        await dp.infer(table_request("g2"))
        assert loaded() == {"cpu", "g1", "g2"} and demand.counters["g0"].evictions == 1
        # Now known: g0's next load makes room first.
        await dp.infer(table_request("g0"))
        assert loaded() == {"cpu", "g2", "g0"} and demand.gpu_used() == {0: 80 * 2**20}
        # 'big' measures 120 MiB: more than GPU 0's budget. Refused as soon as its load measured it (and
        # unloaded), then at once, without a load.
        for _ in range(2):
            with pytest.raises(ResourceExhausted, match=r"model 'big' needs 120\.0 MiB on GPU 0 \(its footprint, "
                                                        r"measured at its load\), more than the whole of GPU 0's "
                                                        r"model memory budget of 100\.0 MiB; raise "
                                                        r"--model-gpu-memory-budget 0:SIZE"):
                await dp.infer(table_request("big"))
            assert "big" not in loaded()
        assert demand.counters["big"].refusals == 2 and demand.counters["big"].loads == 1
        await dp.infer(table_request("g1"))  # evicts g2, the coldest on GPU 0
        # Pinned models hold GPU 0: a load that needs room there is refused naming them.
        await dp.load_model("g0")
        await dp.load_model("g1")
        with pytest.raises(ResourceExhausted) as info:
            await dp.infer(table_request("g2", 1))  # evicted by g1's load; its 40 MiB known
        for words in ("model 'g2' needs 40.0 MiB on GPU 0",
                      "GPU 0's model memory budget of 100.0 MiB has 20.0 MiB free",
                      "pinned: 'g0' 40.0 MiB, 'g1' 40.0 MiB", "--model-gpu-memory-budget 0:SIZE"):
            assert words in info.value.message, info.value.message
        assert "cpu" in loaded()  # never evicted for GPU room
    finally:
        await dp.close()


# -- a model that, while it loads, asks for another load --------------------------------------

LOADS_IN_INITIALIZE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.load_model(model_name="callee")  # raises TritonModelException when refused

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
'''


async def test_pb_utils_load_model_from_initialize_fails_fast_instead_of_waiting_for_itself(tmp_path: Path) -> None:
    from repo_builder import add_python_model

    add_table_model(tmp_path, "callee", 1, 10)
    add_python_model(tmp_path, "loader", LOADS_IN_INITIALIZE, '''
        name: "loader"
        backend: "python"
        max_batch_size: 0
        input [ { name: "I" data_type: TYPE_INT64 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    ''')
    dp = await plane(tmp_path)
    try:
        with pytest.raises(InferdError) as info:
            await asyncio.wait_for(dp.infer(table_request("loader")), 60)  # a deadlock would time out
        assert ("model 'loader' asked (pb_utils.load_model) to load model 'callee' while 'loader' itself was loading"
                in info.value.message), info.value.message
        assert float((await dp.infer(table_request("callee", 2))).outputs["Y"][0]) == expected(1, 2)
    finally:
        await dp.close()


def test_the_driver_uses_the_managers_public_surface_only() -> None:
    """demand.py reads and asks the manager through its public names (``known``, ``ensemble_graph``,
    ``load_locked``, ``evict``, ``set_unavailable``), never a private one: the manager can change its
    insides without breaking the driver (issue 45)."""
    import ast

    from inferd.repository import demand

    tree = ast.parse(Path(demand.__file__).read_text())
    reached = sorted({ast.unparse(node) for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                      and not node.attr.startswith("__")
                      and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))})
    assert reached == []
    manager = ModelManager([])
    assert all(callable(getattr(manager, name)) for name in ("ensemble_graph", "load_locked", "evict",
                                                              "set_unavailable"))
    assert dict(manager.known) == {}


# -- loads side by side: slots, and in-process builds measured one at a time ------------------


async def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(6000):  # bounded: 60 s
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_loads_in_hosts_run_side_by_side_up_to_the_slots(tmp_path: Path) -> None:
    from gated_model import loading_count

    from inferd.hosts.registry import Hosts

    gates = {name: tmp_path / f"gate-{name}" for name in ("a", "b", "c")}
    for name, gate in gates.items():
        add_gated_model(tmp_path / "repo", name, gate, hold_load=True, dims=(1,))
    hosts = Hosts("auto")  # Python models in model hosts
    manager = ModelManager([tmp_path / "repo"], mode="on_demand", hosts=hosts)
    manager.demand.slots = 2
    dp = DataPlane(manager)
    await dp.load_models()
    calls = [asyncio.ensure_future(dp.infer(InferenceRequest(model_name=name, inputs={"INPUT0": np.full(1, i, np.float32)})))
             for i, name in enumerate(gates)]
    try:
        await _until(lambda: loading_count(gates["a"]) + loading_count(gates["b"]) == 2, "a and b loading together")
        assert loading_count(gates["c"]) == 0 and list(manager.demand._held) == ["a", "b"]  # c waits for a slot
        release(gates["a"], "loaded")
        await _until(lambda: loading_count(gates["c"]) == 1, "c loading once a's load ended")
        for gate in gates.values():
            release(gate, "loaded")
            release(gate)
        answers = await asyncio.gather(*calls)
        assert [float(a.outputs["OUTPUT0"][0]) for a in answers] == [0.0, 1.0, 2.0]
    finally:
        for gate in gates.values():
            release(gate, "loaded")
            release(gate)
        await asyncio.gather(*calls, return_exceptions=True)
        await dp.close()
        hosts.kill_all()


async def test_in_process_builds_are_measured_one_at_a_time(tmp_path: Path) -> None:
    from gated_model import loading_count

    gate = tmp_path / "gate"
    for name in ("a", "b"):
        add_gated_model(tmp_path / "repo", name, gate, hold_load=True, dims=(1,))
    dp = await plane(tmp_path / "repo")  # no hosts: every model in this process
    calls = [asyncio.ensure_future(dp.infer(InferenceRequest(model_name=name, inputs={"INPUT0": np.ones(1, np.float32)})))
             for name in ("a", "b")]
    try:
        await _until(lambda: loading_count(gate) == 1, "one build under way")
        assert len(dp.manager.demand._held) == 2  # both admitted: the second waits for the measure, not a slot
        assert dp.manager.gate.owner in ("a", "b")
        release(gate, "loaded")
        release(gate)
        await asyncio.gather(*calls)
        assert loading_count(gate) == 2
        for name in ("a", "b"):
            (usage,) = dp.manager.get(name).stats.memory_usage
            assert usage[0] == "CPU"
    finally:
        release(gate, "loaded")
        release(gate)
        await asyncio.gather(*calls, return_exceptions=True)
        await dp.close()


async def test_a_rebuild_from_the_same_files_reuses_its_footprint_and_builds_beside_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import inferd.repository.manager as manager_module

    for i, name in enumerate(("a", "b")):
        add_table_model(tmp_path, name, i, 250_000)  # 1 MB tables, in this process
    dp = await plane(tmp_path)
    try:
        for name in ("a", "b"):  # first loads: measured, one at a time
            await dp.infer(table_request(name))
        measured = {name: dp.manager.get(name).stats.memory_usage for name in ("a", "b")}
        assert all(usage[0][0] == "CPU" and usage[0][2] >= 1_000_000 for usage in measured.values()), measured
        for name in ("a", "b"):
            await dp.manager.evict(name, "evicted by the test")
        real = manager_module.build_model
        inside: list[str] = []
        go = threading.Event()

        def held(spec, *args, **kwargs):  # type: ignore[no-untyped-def]
            inside.append(spec.name)
            go.wait(60)
            return real(spec, *args, **kwargs)

        monkeypatch.setattr(manager_module, "build_model", held)
        calls = [asyncio.ensure_future(dp.infer(table_request(name, 5))) for name in ("a", "b")]
        try:
            # Both rebuilds under way at once (before, the second waited for the first's measure to end).
            await _until(lambda: len(inside) == 2, f"both rebuilds under way at once, got {inside}")
            assert dp.manager.gate.owner is None  # neither holds the process alone
        finally:
            go.set()
        answers = await asyncio.gather(*calls)
        assert [float(a.outputs["Y"][0]) for a in answers] == [expected(0, 5), expected(1, 5)]
        assert {name: dp.manager.get(name).stats.memory_usage for name in ("a", "b")} == measured
    finally:
        await dp.close()
