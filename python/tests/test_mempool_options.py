"""torch.cuda.MemPool with options: a pool backed by a user's allocator
(CUDAPluggableAllocator: every segment of the pool from its alloc
function, back through its free function, the allocator kept alive by the
pool), use_on_oom (a pool that lends its cached blocks to other
allocations before they fail), no_split (blocks never split)."""

import contextlib
import gc

import pytest
import torch

import _native

MiB = 1 << 20


def blocks_of(pool):
    return [(s["address"], [(b["size"], b["state"]) for b in s["blocks"]]) for s in pool.snapshot()]


def test_a_pool_gets_its_segments_from_its_allocator():
    torch.cuda.empty_cache()
    lib = _native.lib()
    a0, f0 = lib.user_allocs(), lib.user_frees()
    pool = torch.cuda.MemPool(_native.user_allocator().allocator())
    assert pool.use_count() == 1
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        x = torch.full((MiB // 4,), 3.0, device="cuda")  # 1 MiB: a small block
        y = torch.full((5 * MiB,), 7, dtype=torch.uint8, device="cuda")  # a large one
    z = torch.ones(MiB, dtype=torch.uint8, device="cuda")  # outside the pool
    assert pool.use_count() == 1
    assert lib.user_allocs() - a0 == 2  # one small, one large segment
    assert lib.user_owns(x.data_ptr()) and lib.user_owns(y.data_ptr())
    assert not lib.user_owns(z.data_ptr())
    assert pool.snapshot() and all(lib.user_owns(s["address"]) for s in pool.snapshot())
    for s in pool.snapshot():
        assert tuple(s["segment_pool_id"]) == tuple(pool.id)
        assert not s["is_expandable"]
    assert float(x.sum()) == 3.0 * (MiB // 4) and int(y.sum()) == 7 * 5 * MiB
    del x, y, z
    # the pool's destruction gives its free segments back to the allocator
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    assert lib.user_frees() - f0 == 2
    assert lib.user_live() == 0


def test_blocks_outlive_their_pool_and_allocator():
    torch.cuda.empty_cache()
    lib = _native.lib()
    f0 = lib.user_frees()

    def make():
        allocator = _native.user_allocator()
        pool = torch.cuda.MemPool(allocator.allocator())
        with torch.cuda.use_mem_pool(pool):
            return torch.arange(3 * MiB, dtype=torch.int32, device="cuda")

    t = make()  # the pool and its allocator object are gone
    gc.collect()
    torch.cuda.empty_cache()
    assert lib.user_frees() == f0, "freed while a tensor lives in it"
    assert int(t[-1]) == 3 * MiB - 1
    del t
    torch.cuda.empty_cache()
    assert lib.user_frees() == f0 + 1
    assert lib.user_live() == 0


@contextlib.contextmanager
def limited():
    """Memory for 80 MiB more than is reserved now."""
    torch.cuda.empty_cache()
    orig = torch.cuda.get_per_process_memory_fraction()
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 80 * MiB) / total)
    try:
        yield
    finally:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(orig)


def test_use_on_oom_pools_lend_their_free_blocks():
    with limited():
        lender = torch.cuda.MemPool(use_on_oom=True)
        keeper = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(keeper):
            k = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(lender):
            l = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        lender_block = l.data_ptr()
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        del k, l
        # both pools cache a free 40 MiB block; a default allocation may take
        # only the lender's
        c = torch.ones(30 * MiB, dtype=torch.uint8, device="cuda")
        assert c.data_ptr() == lender_block
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        # (read in place: a reduction would need memory the cap does not leave)
        assert [c[i].item() for i in (0, 15 * MiB, 30 * MiB - 1)] == [1, 1, 1]
        del c
        # lent blocks go back to the lender
        with torch.cuda.use_mem_pool(lender):
            e = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        assert e.data_ptr() == lender_block
        del e, lender, keeper
        gc.collect()


def test_a_deleted_lender_lends_nothing():
    with limited():
        for _ in range(3):
            p = torch.cuda.MemPool(use_on_oom=True)
            with torch.cuda.use_mem_pool(p):
                t = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
            del t, p
            gc.collect()
        lender = torch.cuda.MemPool(use_on_oom=True)
        with torch.cuda.use_mem_pool(lender):
            t = torch.empty(70 * MiB, dtype=torch.uint8, device="cuda")
        del t
        a = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
        del a, b, lender
        gc.collect()


def test_no_split_pools_keep_blocks_whole():
    torch.cuda.empty_cache()
    split, whole = torch.cuda.MemPool(), torch.cuda.MemPool(no_split=True)
    kept = []
    for _ in range(2):
        with torch.cuda.use_mem_pool(split):
            kept.append(torch.empty(4 * MiB, dtype=torch.uint8, device="cuda"))
        with torch.cuda.use_mem_pool(whole):
            kept.append(torch.empty(4 * MiB, dtype=torch.uint8, device="cuda"))
    w = blocks_of(whole)
    s = blocks_of(split)
    assert len(w) > len(s)
    for _, blocks in w:
        assert len(blocks) == 1 and blocks[0][1] == "active_allocated", w
    assert sum(len(b) for _, b in w) < sum(len(b) for _, b in s)
    del kept, split, whole
    gc.collect()
