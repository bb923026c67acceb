"""The one-thread session an ONNX instance keeps beside its own for small batches
(inferd/backends/onnxruntime.py, LEAN_SESSION_MAX_BYTES). Which batches take it is decided at load by
timing both sessions; here those timings are made up (the runs themselves are real), so nothing reads a
clock, and each session's runs are counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.backends import onnxruntime as ortb
from inferd.backends.base import Device, InstanceSpec
from inferd.config import parse_config_text, validate
from inferd.examples import onnx_models as om

D = 16


def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wins_from: int, threads: int = 2,
             extra: str = "", model: bytes | None = None, wall=None, dims: int = D) -> ortb.OnnxInstance:  # type: ignore[no-untyped-def]
    """An instance of a small MLP given ``threads`` intra-op threads, loaded while the session with more
    than one thread reads 10x faster than the one-thread session from ``wins_from`` rows up."""

    def wall_ns(run, names, inputs, options) -> int:  # type: ignore[no-untyped-def]
        run(names, inputs, options)
        rows = len(next(iter(inputs.values())))
        threaded = run.__self__.session_options.intra_op_num_threads > 1
        return 10 if threaded and rows >= wins_from else 100

    monkeypatch.setattr(ortb, "_wall_ns", wall or wall_ns)
    (tmp_path / "1").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "1" / "model.onnx"
    if not path.exists():  # a second instance in the same folder loads the same file again
        path.write_bytes(model if model is not None else om.serialize(om.mlp(D, 32, D, seed=5)))
    text = (f'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n' + extra)
    spec = validate(parse_config_text(text, model="m"))
    ispec = InstanceSpec("m_0", Device("cpu"), tmp_path, tmp_path / "1", 1, path, threads=threads)
    return ortb.OnnxRuntimeBackend().create_instance(spec, ispec)  # type: ignore[return-value]


def counted(inst: ortb.OnnxInstance) -> dict[str, list[int]]:
    """The rows of each batch each session runs, from now on."""
    seen: dict[str, list[int]] = {"lean": [], "threaded": []}
    for attr, key in (("_lean_run", "lean"), ("_session_run", "threaded")):
        run = getattr(inst, attr)

        def spy(names, inputs, options, run=run, key=key):  # type: ignore[no-untyped-def]
            seen[key].append(len(next(iter(inputs.values()))))
            return run(names, inputs, options)

        setattr(inst, attr, spy)
    return seen


def test_batches_below_the_size_where_threads_pay_run_on_the_one_thread_session(tmp_path, monkeypatch):
    inst = instance(tmp_path, monkeypatch, wins_from=8)
    assert inst.lean_rows == 4  # 1, 2 and 4 rows timed no faster on two threads; 8 rows did
    seen = counted(inst)
    rng = np.random.default_rng(0)
    for rows in (1, 3, 4, 5, 8, 64):
        x = rng.standard_normal((rows, D), dtype=np.float32)
        got = inst.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        want = inst.session.run(["OUTPUT0"], {"INPUT0": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # the same model either way
    assert seen == {"lean": [1, 3, 4], "threaded": [5, 8, 64]}
    inst.close()
    assert not hasattr(inst, "_lean_session") and not hasattr(inst, "session")


def test_no_lean_session_where_threads_pay_from_one_row(tmp_path, monkeypatch):
    inst = instance(tmp_path, monkeypatch, wins_from=1)
    assert inst.lean_rows == 0 and not hasattr(inst, "_lean_session")
    assert inst.run({"INPUT0": np.ones((2, D), np.float32)}, ["OUTPUT0"])["OUTPUT0"].shape == (2, D)


def test_all_batches_lean_where_threads_never_pay(tmp_path, monkeypatch):
    assert instance(tmp_path, monkeypatch, wins_from=1000).lean_rows == 64


@pytest.mark.parametrize("why, threads, extra, size", [
    ("one thread already", 1, "", 0),
    ("the config's own thread count is kept",
     2, 'parameters { key: "intra_op_thread_count" value { string_value: "2" } }\n', 0),
    ("a model over LEAN_SESSION_MAX_BYTES", 2, "", ortb.LEAN_SESSION_MAX_BYTES),
])
def test_no_lean_session(tmp_path, monkeypatch, why, threads, extra, size):
    model = om.serialize(om.mlp(D, size // (8 * D) + 32, D, seed=5))  # ~size bytes of weights
    inst = instance(tmp_path, monkeypatch, wins_from=1000, threads=threads, extra=extra, model=model)
    assert inst.lean_rows == 0 and not hasattr(inst, "_lean_session"), why


def test_a_model_that_refuses_zeros_loads_without_a_lean_session(tmp_path, monkeypatch):
    def failing(run, names, inputs, options) -> int:  # type: ignore[no-untyped-def]
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : a zero where it cannot be")

    inst = instance(tmp_path, monkeypatch, wins_from=1000, wall=failing)
    assert inst.lean_rows == 0 and not hasattr(inst, "_lean_session")
    assert inst.run({"INPUT0": np.ones((1, D), np.float32)}, ["OUTPUT0"])["OUTPUT0"].shape == (1, D)


def test_a_second_load_of_the_same_file_reuses_what_the_first_measured(tmp_path, monkeypatch):
    def timed_again(run, names, inputs, options) -> int:  # type: ignore[no-untyped-def]
        raise AssertionError("a second load of the same file timed the sessions again")

    builds: list[int] = []
    build = ortb._build_session

    def counted_build(backend, spec, instance, options, providers, level):  # type: ignore[no-untyped-def]
        builds.append(options.intra_op_num_threads)
        return build(backend, spec, instance, options, providers, level)

    monkeypatch.setattr(ortb, "_build_session", counted_build)
    assert instance(tmp_path / "kept", monkeypatch, wins_from=8).lean_rows == 4
    again = instance(tmp_path / "kept", monkeypatch, wins_from=8, wall=timed_again)
    assert again.lean_rows == 4 and hasattr(again, "_lean_session")  # timing again would have dropped it
    assert instance(tmp_path / "dropped", monkeypatch, wins_from=1).lean_rows == 0
    builds.clear()
    again = instance(tmp_path / "dropped", monkeypatch, wins_from=1, wall=timed_again)
    assert again.lean_rows == 0 and builds == [2]  # the threaded session alone: no second one built to drop


def test_a_lean_batch_with_outputs_big_enough_for_the_pool_runs_on_the_lean_session(tmp_path, monkeypatch):
    wide = 4096  # 16 KiB of output a row: 4 rows reach POOLED_OUTPUT_BYTES
    model = om.serialize(om.mlp(wide, 32, wide, seed=7))
    inst = instance(tmp_path, monkeypatch, wins_from=8, model=model, dims=wide)
    assert inst.lean_rows == 4 and 4 * wide * 4 >= ortb.POOLED_OUTPUT_BYTES
    used: list[int] = []
    for session, threads in ((inst._lean_session, 1), (inst.session, 2)):

        def run(binding, options, bound=session.run_with_iobinding, threads=threads):  # type: ignore[no-untyped-def]
            used.append(threads)
            return bound(binding, options)

        monkeypatch.setattr(session, "run_with_iobinding", run)
    x = np.random.default_rng(1).standard_normal((4, wide), dtype=np.float32)
    got = inst.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
    np.testing.assert_allclose(got, inst.session.run(["OUTPUT0"], {"INPUT0": x})[0], rtol=1e-5, atol=1e-5)
    assert used == [1]  # written into the pool by the one-thread session
    inst.run({"INPUT0": np.zeros((8, wide), np.float32)}, ["OUTPUT0"])
    assert used == [1, 2]


def test_a_sequence_model_with_implicit_state_loads_without_timing_zeros_it_cannot_run(tmp_path, capfd):
    # Its ACC_IN comes from the sequence batcher, not the config's inputs: a sample of the config's inputs
    # alone fails in ONNX Runtime, which logs that failure as an error on the server's stderr at every load.
    (tmp_path / "1").mkdir()
    path = tmp_path / "1" / "model.onnx"
    path.write_bytes(om.serialize(om.accumulator(np.int32)))
    text = ('name: "acc"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
            'sequence_batching { direct { } state [ { input_name: "ACC_IN" output_name: "ACC_OUT" '
            'data_type: TYPE_INT32 dims: [ 1 ] initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] '
            'zero_data: true } } ] }\n')
    spec = validate(parse_config_text(text, model="acc"))
    ispec = InstanceSpec("acc_0", Device("cpu"), tmp_path, tmp_path / "1", 1, path, threads=2)
    inst = ortb.OnnxRuntimeBackend().create_instance(spec, ispec)
    assert inst.lean_rows == 0 and not hasattr(inst, "_lean_session")
    assert "Missing Input" not in capfd.readouterr().err
    got = inst.run({"INPUT": np.array([[2]], np.int32), "ACC_IN": np.array([[3]], np.int32)}, ["OUTPUT"])
    assert got["OUTPUT"].tolist() == [[5]]
