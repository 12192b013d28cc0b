"""Tensor.record_stream reaches the allocator: a block used on a side stream
is not handed out again before the side stream's work is done."""

import torch

N = 1 << 20  # 4 MiB of float32
SLEEP = 200_000_000  # GPU cycles (~0.1 s)


def _side_reads_freed_tensor(record: bool, shift: int = 0):
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    x = torch.full((N + shift,), 1.0, device="cuda")
    view = x[shift:]
    base = x.data_ptr()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)  # the side stream reads x late
        out = torch.empty(N, device="cuda")
        torch.mul(view, 2.0, out=out)
    if record:
        view.record_stream(side)
    del x, view
    # the main stream allocates the same size again at once and overwrites it
    z = torch.full((N + shift,), 7.0, device="cuda")
    reused = z.data_ptr() == base
    torch.cuda.synchronize()
    return out, reused


def test_record_stream_protects_the_block():
    out, reused = _side_reads_freed_tensor(record=True)
    assert not reused, "the block was handed out while the side stream still used it"
    assert torch.equal(out, torch.full_like(out, 2.0))


def test_without_record_stream_the_block_is_reused_at_once():
    # the hazard record_stream prevents: same stream, same size -> same block
    out, reused = _side_reads_freed_tensor(record=False)
    assert reused


def test_record_stream_on_a_shifted_view():
    out, reused = _side_reads_freed_tensor(record=True, shift=12345)
    assert not reused
    assert torch.equal(out, torch.full_like(out, 2.0))


def test_block_is_reused_after_the_side_stream_is_done():
    side = torch.cuda.Stream()
    x = torch.empty(N, device="cuda")
    base = x.data_ptr()
    with torch.cuda.stream(side):
        x.add_(1)
    x.record_stream(side)
    del x
    side.synchronize()
    torch.cuda.synchronize()
    # the recorded use is complete: the next allocation may take the block
    found = False
    keep = []
    for _ in range(4):
        y = torch.empty(N, device="cuda")
        keep.append(y)
        found |= y.data_ptr() == base
    assert found


def test_record_stream_blocks_are_freed_by_the_oom_retry():
    free, total = torch.cuda.mem_get_info()
    side = torch.cuda.Stream()
    big = int(free * 0.6) // 4
    x = torch.empty(big, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        x.add_(1)
    x.record_stream(side)
    del x
    # needs x's memory: the allocator must wait for the side stream (sync)
    y = torch.empty(big, device="cuda")
    assert torch.cuda.memory_stats()["num_alloc_retries"] >= 1
    del y
