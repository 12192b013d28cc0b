"""torch.cuda.MemPool and use_mem_pool: ids, use counts, routing by
thread, snapshots per pool, release; unsupported options raise the typed
error."""

import threading

import torch

MiB = 1 << 20


def seg_addrs(snapshot):
    out = set()
    for s in snapshot:
        a = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                out.add(a)
            a += b["size"]
    return out


def test_mempool_ids_increase():
    a, b = torch.cuda.MemPool(), torch.cuda.MemPool()
    h = torch.cuda.graph_pool_handle()
    c = torch.cuda.MemPool()
    assert a.id[0] == b.id[0] == c.id[0] == h[0] == 0
    assert a.id[1] < b.id[1] < h[1] < c.id[1]


def test_use_mem_pool_routes_this_thread_only():
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1
    other = {}

    def elsewhere():
        other["t"] = torch.empty(MiB, dtype=torch.uint8, device="cuda")

    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
    assert pool.use_count() == 1
    y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    in_pool = seg_addrs(pool.snapshot())
    assert x.data_ptr() in in_pool
    assert y.data_ptr() not in in_pool
    assert other["t"].data_ptr() not in in_pool
    for s in pool.snapshot():
        assert tuple(s["segment_pool_id"]) == tuple(pool.id)
    x.fill_(1)
    assert int(x.sum()) == 3 * MiB


def test_nested_pools_and_release():
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    p1, p2 = torch.cuda.MemPool(), torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(p1):
        a = torch.empty(MiB, device="cuda")
        with torch.cuda.use_mem_pool(p2):
            b = torch.empty(MiB, device="cuda")
        c = torch.empty(MiB, device="cuda")
    assert a.data_ptr() in seg_addrs(p1.snapshot())
    assert c.data_ptr() in seg_addrs(p1.snapshot())
    assert b.data_ptr() in seg_addrs(p2.snapshot())
    assert b.data_ptr() not in seg_addrs(p1.snapshot())
    del a, b, c
    del p1, p2
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == base


def test_pool_memory_is_reused_within_the_pool():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        p = x.data_ptr()
        del x
        y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    assert y.data_ptr() == p
    z = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    assert z.data_ptr() != p
