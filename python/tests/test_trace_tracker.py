"""Allocator trace trackers (the hook ProcessGroupNCCL attaches to register
every segment with its communicators) see every segment event: memory
obtained (segment_alloc, or segment_map for pages of an expandable
segment) and memory returned (segment_free / segment_unmap), each with
the owning pool's id."""

import gc

import torch

import _native

MiB = 1 << 20
ADD = (_native.SEGMENT_ALLOC, _native.SEGMENT_MAP)
REMOVE = (_native.SEGMENT_FREE, _native.SEGMENT_UNMAP)


def counts(actions):
    lib = _native.lib()
    return sum(lib.tracker_count(a) for a in actions), sum(lib.tracker_bytes(a) for a in actions)


def test_tracker_sees_memory_come_and_go():
    torch.ones(1, device="cuda")  # the device's allocator exists
    torch.cuda.empty_cache()
    lib = _native.lib()
    lib.tracker_attach()
    lib.tracker_reset()
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    n_add, bytes_add = counts(ADD)
    assert n_add >= 1 and bytes_add >= 30 * MiB
    del x
    torch.cuda.empty_cache()
    n_rm, bytes_rm = counts(REMOVE)
    assert n_rm >= 1 and bytes_rm >= bytes_add, (bytes_add, bytes_rm)


def test_tracker_names_the_pool():
    torch.ones(1, device="cuda")
    lib = _native.lib()
    lib.tracker_attach()
    lib.tracker_reset()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        y = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    pid = tuple(pool.id)
    added = sum(lib.tracker_count_in_pool(a, *pid) for a in ADD)
    assert added >= 1
    del y, pool
    gc.collect()
    torch.cuda.empty_cache()
    removed = sum(lib.tracker_count_in_pool(a, *pid) for a in REMOVE)
    assert removed == added
