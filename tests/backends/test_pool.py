"""Pooled batch buffers (inferd.backends.pool): reuse once no view is alive, bounded depth."""

from __future__ import annotations

import numpy as np

from inferd.backends.pool import BufferPool


def test_a_buffer_is_reused_once_no_view_of_it_is_alive():
    pool = BufferPool()
    a = pool.take("x", np.float32, (4, 8), capacity=64 * 8)
    a[:] = 1.0
    row = a[1:2]  # a response's view
    del a
    b = pool.take("x", np.float32, (2, 8))
    assert not np.shares_memory(b, row)  # row still holds the first buffer
    del b
    del row
    c = pool.take("x", np.float32, (64, 8))  # fits the capacity of the first buffer
    assert pool.allocated == 2 and pool.reused == 1
    assert c.flags.c_contiguous and c.shape == (64, 8)


def test_views_of_views_and_reshapes_still_hold_the_buffer():
    pool = BufferPool(depth=1)
    a = pool.take("x", np.int64, (8,))
    held = a.reshape(2, 4)[1][1:]
    del a
    assert pool.in_use() == 1
    other = pool.take("x", np.int64, (8,))  # the one buffer is held: a plain array, not pooled
    assert pool.overflow == 1 and not np.shares_memory(other, held)
    del held
    assert pool.in_use() == 0


def test_a_buffer_too_small_for_a_batch_is_replaced_by_a_larger_one():
    pool = BufferPool(depth=1)
    small = pool.take("x", np.float32, (2, 4))
    del small
    big = pool.take("x", np.float32, (16, 4))
    assert pool.buffers() == 1 and pool.allocated == 2 and big.size == 64


def test_keys_and_dtypes_do_not_mix():
    pool = BufferPool()
    a = pool.take("x", np.float32, (4,))
    del a
    b = pool.take("x", np.float64, (4,))
    c = pool.take("y", np.float32, (4,))
    assert b.dtype == np.float64 and c.dtype == np.float32 and pool.reused == 0


# -- batches assembled into pooled buffers, outputs written into them ------------------------------


def onnx_instance(tmp_path, pooled: bool = True, d: int = 256):  # type: ignore[no-untyped-def]
    from inferd.backends.base import Device, InstanceSpec
    from inferd.backends.onnxruntime import OnnxRuntimeBackend
    from inferd.config import parse_config_text, validate
    from inferd.examples import onnx_models as om

    (tmp_path / "1").mkdir(exist_ok=True)
    path = tmp_path / "1" / "model.onnx"
    path.write_bytes(om.serialize(om.mlp(d, 64, d, seed=3)))
    text = (f'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
            f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {d} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {d} ] }} ]\n'
            f'parameters {{ key: "inferd.pooled_buffers" value {{ string_value: "{str(pooled).lower()}" }} }}\n')
    spec = validate(parse_config_text(text, model="m"))
    ispec = InstanceSpec("m_0", Device("cpu"), tmp_path, tmp_path / "1", 1, path, threads=1)
    return OnnxRuntimeBackend().create_instance(spec, ispec)


def requests(n: int, d: int = 256, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"INPUT0": rng.standard_normal((1, d), dtype=np.float32)} for _ in range(n)]


def test_onnx_runtime_writes_a_big_batch_into_pooled_buffers_and_hands_out_views(tmp_path):
    pooled, plain = onnx_instance(tmp_path), onnx_instance(tmp_path, pooled=False)
    batch = requests(64)  # 64 x 256 x 4 bytes out: worth binding
    got = pooled.execute(batch, ["OUTPUT0"]).outputs
    want = plain.execute(batch, ["OUTPUT0"]).outputs
    for g, w in zip(got, want):
        np.testing.assert_allclose(g["OUTPUT0"], w["OUTPUT0"], rtol=1e-5)
    assert all(np.shares_memory(got[0]["OUTPUT0"], g["OUTPUT0"]) is False for g in got[1:])
    assert got[0]["OUTPUT0"].base is got[1]["OUTPUT0"].base  # views of one pooled buffer
    assert pooled.pool.buffers() == 2  # the joined input and the output
    del got, g, w
    again = pooled.execute(requests(64, seed=1), ["OUTPUT0"]).outputs
    assert pooled.pool.allocated == 2 and pooled.pool.reused == 2  # nothing held the first batch's buffers
    assert plain.pool is None
    del again


def test_a_small_batch_is_not_bound_and_one_request_is_not_copied(tmp_path):
    instance = onnx_instance(tmp_path)
    one = requests(1)
    instance.execute(one, ["OUTPUT0"])
    instance.execute(requests(4), ["OUTPUT0"])  # 4 KiB out: ONNX Runtime's own arena is cheaper
    assert instance.pool.buffers() == 1  # only the joined input of the batch of 4


def test_padding_into_a_pooled_buffer_fills_the_pad_value():
    from inferd.backends.batching import pad_to_longest

    pool = BufferPool()
    stale = pool.take("IDS", np.int64, (2, 4))
    stale[:] = 99  # what an earlier batch left there
    del stale
    out, real = pad_to_longest([np.array([[1, 2]]), np.array([[3, 4, 5, 6]])], 7, pool, "IDS")
    assert out.tolist() == [[1, 2, 7, 7], [3, 4, 5, 6]] and real == 6 and pool.reused == 1
