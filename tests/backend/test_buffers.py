"""The scratch arrays layers and losses reuse in the training loop (dlrun.backend.buffers)."""
import numpy as np

from dlrun.backend.buffers import BufferPool


def _pool():
    pool = BufferPool()
    pool.enabled = True
    return pool


def test_a_shorter_batch_gets_the_leading_rows_of_the_full_batch_array():
    pool = _pool()
    full = pool.get(np, "y", (8, 3), np.float32)
    short = pool.get(np, "y", (5, 3), np.float32)
    assert short.shape == (5, 3) and short.flags.c_contiguous and np.shares_memory(full, short)
    assert short.__array_interface__["data"][0] == full.__array_interface__["data"][0]
    assert pool.get(np, "y", (5, 3), np.float32) is short and pool.get(np, "y", (8, 3), np.float32) is full


def test_a_larger_request_after_smaller_ones_becomes_the_array_they_view():
    pool = _pool()
    small = pool.get(np, "dx", (2, 4), np.float64)
    large = pool.get(np, "dx", (6, 4), np.float64)
    assert not np.shares_memory(small, large)
    again = pool.get(np, "dx", (2, 4), np.float64)
    assert again is not small and np.shares_memory(again, large)


def test_other_names_dtypes_and_trailing_shapes_have_their_own_memory():
    pool = _pool()
    y = pool.get(np, "y", (8, 3), np.float32)
    others = [pool.get(np, "dx", (4, 3), np.float32), pool.get(np, "y", (4, 3), np.float64),
              pool.get(np, "y", (4, 2), np.float32), pool.get(np, "y", (4, 3, 1), np.float32),
              pool.get(np, "y", (), np.float32)]
    assert not any(np.shares_memory(y, o) for o in others)


def test_a_disabled_pool_gives_nothing():
    pool = BufferPool()
    assert pool.get(np, "y", (8, 3), np.float32) is None


def test_a_buffer_named_as_the_pools_own_entries_leaves_them_alone():
    pool = _pool()
    ones = pool.ones(np, 4, np.float32)  # cached as ("ones", 4, float32, numpy)
    pool.get(np, "ones", (2, 3), np.float32)
    larger = pool.get(np, "ones", (5, 3), np.float32)  # a new largest: the smaller ones are made again
    assert np.shares_memory(pool.get(np, "ones", (2, 3), np.float32), larger)
    assert pool.ones(np, 4, np.float32) is ones and not np.shares_memory(ones, larger)
