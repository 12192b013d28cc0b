"""Memory statistics: every torch.cuda / torch.accelerator figure, resets,
empty_cache, and consistency of the statistics with the snapshot."""

import gc
import random

import torch

import _setup

MiB = 1 << 20


def cur(key):
    return torch.cuda.memory_stats()[key]


def test_backend_name():
    want = "cachalot" if _setup.is_cachalot() else "native"
    assert torch.cuda.memory.get_allocator_backend() == want


def test_allocation_moves_the_stats_by_the_rounded_size():
    # tensors of earlier tests that only the collector frees would move the
    # counters in the middle of this test
    gc.collect()
    torch.cuda.synchronize()
    # blocks of earlier record_stream tests wait for their events; the next
    # allocation would free them (both allocators process completed events
    # in malloc): empty_cache frees them now
    torch.cuda.empty_cache()
    a0, act0, req0, n0 = (cur("allocated_bytes.all.current"), cur("active_bytes.all.current"),
                          cur("requested_bytes.all.current"), cur("allocation.all.current"))
    x = torch.empty(250, dtype=torch.float32, device="cuda")  # 1000 B -> 1024 B
    assert cur("allocated_bytes.all.current") == a0 + 1024
    assert cur("active_bytes.all.current") == act0 + 1024
    assert cur("requested_bytes.all.current") == req0 + 1000
    assert cur("allocation.all.current") == n0 + 1
    assert cur("allocation.small_pool.current") >= 1
    assert torch.cuda.memory_allocated() == a0 + 1024
    del x
    assert cur("allocated_bytes.all.current") == a0
    assert cur("allocation.all.current") == n0


def test_large_pool_and_segments():
    # 25 MiB: a segment of its own, rounded to 2 MiB (no cached remainder
    # of a live segment is that large once the cache is empty)
    torch.cuda.empty_cache()
    seg0, res0 = cur("segment.all.current"), cur("reserved_bytes.all.current")
    dev0 = cur("num_device_alloc")
    x = torch.empty(25 * MiB, dtype=torch.uint8, device="cuda")
    assert cur("allocated_bytes.large_pool.current") >= 25 * MiB
    ptr = x.data_ptr()
    (seg,) = [s for s in torch.cuda.memory_snapshot() if s["address"] <= ptr < s["address"] + s["total_size"]]
    # an expandable segment's pages are not segments of the statistics
    assert cur("segment.all.current") == seg0 + (0 if seg["is_expandable"] else 1)
    assert cur("reserved_bytes.all.current") == res0 + 26 * MiB
    assert cur("num_device_alloc") == dev0 + 1
    del x
    assert cur("reserved_bytes.all.current") == res0 + 26 * MiB  # cached
    y = torch.empty(25 * MiB, dtype=torch.uint8, device="cuda")
    assert cur("num_device_alloc") == dev0 + 1  # the cached segment again
    del y
    free0 = cur("num_device_free")
    torch.cuda.empty_cache()
    assert cur("reserved_bytes.all.current") == res0
    assert cur("num_device_free") == free0 + 1
    assert torch.cuda.memory_reserved() == res0


def test_accelerator_twins_agree():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    a = torch.accelerator.memory_stats()
    c = torch.cuda.memory_stats()
    assert len(c) == 122
    for k in ("allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.peak",
              "num_device_alloc"):
        assert a[k] == c[k], k
    assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.cuda.memory_reserved()
    assert torch.accelerator.max_memory_allocated() == torch.cuda.max_memory_allocated()
    del x
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == torch.cuda.memory_reserved()


def test_peaks_and_resets():
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del x
    assert torch.cuda.max_memory_allocated() >= base + 64 * MiB
    assert torch.cuda.max_memory_reserved() >= 64 * MiB
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()
    assert cur("allocation.all.allocated") > 0
    torch.cuda.reset_accumulated_memory_stats()
    assert cur("allocation.all.allocated") == 0
    assert cur("allocation.all.freed") == 0
    assert cur("num_device_alloc") == 0


def test_mem_get_info_and_summary():
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    assert total == torch.cuda.get_device_properties(0).total_memory
    f2, t2 = torch.accelerator.get_memory_info()
    assert t2 == total
    x = torch.empty(MiB, device="cuda")
    s = torch.cuda.memory_summary()
    assert "Allocated memory" in s and "GPU reserved memory" in s
    del x


def test_caching_allocator_alloc_and_delete():
    a0 = torch.cuda.memory_allocated()
    p = torch.cuda.caching_allocator_alloc(1)
    assert torch.cuda.memory_allocated() == a0 + 512
    torch.cuda.caching_allocator_delete(p)
    assert torch.cuda.memory_allocated() == a0
    s = torch.cuda.Stream()
    p = torch.cuda.caching_allocator_alloc(MiB, stream=s)
    torch.cuda.caching_allocator_delete(p)


def snapshot_figures():
    """The current statistics as computed from the snapshot."""
    f = dict.fromkeys(["allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes",
                       "allocation", "active", "segment", "inactive_split", "inactive_split_bytes"], 0)
    for seg in torch.cuda.memory_snapshot():
        # the mapped ranges of an expandable segment are reported as
        # segments but enter neither the segment nor the inactive-split
        # statistics (PyTorch's expandable mode counts them the same way)
        expandable = bool(seg.get("is_expandable"))
        f["segment"] += 0 if expandable else 1
        f["reserved_bytes"] += seg["total_size"]
        blocks = seg["blocks"]
        assert sum(b["size"] for b in blocks) == seg["total_size"]
        for b in blocks:
            if b["state"] == "active_allocated":
                f["allocation"] += 1
                f["allocated_bytes"] += b["size"]
            if b["state"] != "inactive":
                f["active"] += 1
                f["active_bytes"] += b["size"]
                f["requested_bytes"] += b["requested_size"]
            elif len(blocks) > 1 and not expandable:
                f["inactive_split"] += 1
                f["inactive_split_bytes"] += b["size"]
    return f


def check_consistency():
    torch.cuda.synchronize()
    f = snapshot_figures()
    st = torch.cuda.memory_stats()
    for k, v in f.items():
        assert st[f"{k}.all.current"] == v, (k, st[f"{k}.all.current"], v)


def test_stats_match_the_snapshot():
    rng = random.Random(7)
    live = []
    check_consistency()
    for step in range(300):
        r = rng.random()
        if r < 0.55 or not live:
            n = rng.choice([1, 100, 511, 513, 4000, 70_000, 1_100_000, 3 * MiB, 11 * MiB, 25 * MiB])
            live.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        elif r < 0.95:
            live.pop(rng.randrange(len(live)))
        else:
            torch.cuda.empty_cache()
        if step % 25 == 0:
            check_consistency()
    check_consistency()
    live.clear()
    torch.cuda.empty_cache()
    check_consistency()
    assert cur("allocated_bytes.all.current") == torch.cuda.memory_allocated()


def test_stats_after_del_and_empty_cache():
    torch.cuda.empty_cache()
    base = {k: v for k, v in torch.cuda.memory_stats().items() if k.endswith(".current")}
    xs = [torch.randn(n, device="cuda") for n in (256, 10_000, 300_000, 5_000_000)]
    ys = [x * 2 for x in xs]
    assert torch.cuda.memory_allocated() > base["allocated_bytes.all.current"]
    del xs, ys
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    after = {k: v for k, v in torch.cuda.memory_stats().items() if k.endswith(".current")}
    assert after == base
    assert cur("active_bytes.all.freed") >= 4 * (256 + 10_000 + 300_000 + 5_000_000)


def test_matmul_peak_is_the_same_for_equivalent_ops():
    a = torch.randn(256, 512, device="cuda")
    b = torch.randn(512, 128, device="cuda")
    peaks = []
    for f in (lambda: a @ b, lambda: torch.matmul(a, b), lambda: torch.mm(a, b)):
        f()  # cuBLAS workspace and handles first
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = f()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del out
    assert peaks[0] == 256 * 128 * 4 and len(set(peaks)) == 1, peaks
