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
