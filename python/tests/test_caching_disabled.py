"""torch.cuda.memory.caching_allocator_enable(False): while the cache is
off every request gets device memory of its own, outside the statistics,
and is given back when freed; turned on again, allocations are cached and
counted as before."""

import torch

MiB = 1 << 20


def requested():
    return torch.cuda.memory_stats()["requested_bytes.all.allocated"]


def raw_alloc_requested(n):
    """requested_bytes.all.allocated growth of one raw allocation of n bytes."""
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    before = requested()
    p = torch._C._cuda_cudaCachingAllocator_raw_alloc(n, stream)
    after = requested()
    torch._C._cuda_cudaCachingAllocator_raw_delete(p)
    return after - before


def test_cache_off_and_on():
    torch.ones(1, device="cuda")  # CUDA initialized: the switch applies
    try:
        torch.cuda.memory.caching_allocator_enable(False)
        assert raw_alloc_requested(MiB) == 0
        # tensors work, their memory goes back to the device when freed
        free0, _ = torch.cuda.mem_get_info()
        before = requested()
        x = torch.full((64 * MiB,), 5, dtype=torch.uint8, device="cuda")
        free1, _ = torch.cuda.mem_get_info()
        assert free0 - free1 >= 64 * MiB
        assert requested() == before
        assert int(x.sum()) == 5 * 64 * MiB
        x.record_stream(torch.cuda.Stream())  # accepted, nothing to wait for
        del x
        torch.cuda.synchronize()
        free2, _ = torch.cuda.mem_get_info()
        assert free2 >= free0 - 2 * MiB, "not given back on free"
    finally:
        torch.cuda.memory.caching_allocator_enable(True)
    assert raw_alloc_requested(MiB) == MiB
    y = torch.ones(MiB, dtype=torch.uint8, device="cuda")
    assert int(y.sum()) == MiB


def test_a_tensor_from_the_cache_freed_while_it_is_off():
    x = torch.ones(3 * MiB, dtype=torch.uint8, device="cuda")
    allocated = torch.cuda.memory_allocated()
    try:
        torch.cuda.memory.caching_allocator_enable(False)
        del x
        assert torch.cuda.memory_allocated() == allocated - 3 * MiB
    finally:
        torch.cuda.memory.caching_allocator_enable(True)
