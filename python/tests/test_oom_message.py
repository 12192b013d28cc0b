"""The out-of-memory message starts with PyTorch's own text, which code in
the wild parses (HF accelerate: a RuntimeError with one argument
containing "CUDA out of memory."; Lightning: "CUDA" and "out of memory");
cachalot's report follows on its own line."""

import re

import pytest
import torch

import _setup

GiB = 1 << 30


def oom(n_bytes):
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    return e.value


def test_pytorch_text_first():
    torch.ones(1, device="cuda")
    e = oom(800_000_000 * GiB)
    assert isinstance(e, RuntimeError) and len(e.args) == 1
    msg = e.args[0]
    first = msg.splitlines()[0]
    assert first.startswith("CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU "), first
    idx = torch.cuda.current_device()
    assert re.search(rf"GPU {idx} has a total capacity of [0-9.]+ [KMG]iB of which [0-9.]+ "
                     r"([KMG]iB|bytes) is free\. ", first), first
    assert re.search(r"Of the allocated memory [0-9.]+ ([KMG]iB|bytes) is allocated by PyTorch, "
                     r"(with [0-9.]+ ([KMG]iB|bytes) allocated in private pools \(e\.g\., CUDA Graphs\), )?"
                     r"and [0-9.]+ ([KMG]iB|bytes) is reserved by PyTorch but unallocated\.", first), first
    assert first.endswith("#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"), first
    if _setup.is_cachalot():
        assert msg.splitlines()[1].startswith("cachalot: "), msg
    # what accelerate and Lightning test
    assert "CUDA out of memory." in msg
    assert "CUDA" in msg and "out of memory" in msg
    # the device still works
    assert float(torch.ones(10, device="cuda").sum()) == 10.0


def test_the_memory_fraction_appears_as_allowed():
    orig = torch.cuda.get_per_process_memory_fraction()
    try:
        torch.cuda.set_per_process_memory_fraction(0.5)
        _, total = torch.cuda.mem_get_info()
        msg = oom(int(total * 0.6)).args[0]
        assert re.search(r"is free\. (.* )?[0-9.]+ GiB allowed; Of the allocated memory", msg), msg
    finally:
        torch.cuda.set_per_process_memory_fraction(orig)


def test_more_than_an_exabyte():
    msg = oom(1 << 61).args[0]
    assert msg.startswith("CUDA out of memory. Tried to allocate more than 1EB memory."), msg
