"""What cachalot does not do raises a typed error naming it (and the same
calls work on the native allocator, so the tests show the difference)."""

import pytest
import torch

import _setup


def expect_unsupported(fn, what):
    if _setup.is_cachalot():
        with pytest.raises(NotImplementedError, match=what):
            fn()
    else:
        fn()


def test_cuda_ipc():
    t = torch.ones(1024, device="cuda")
    expect_unsupported(lambda: t.untyped_storage()._share_cuda_(), "CUDA IPC")


def test_mempool_use_on_oom():
    expect_unsupported(lambda: torch.cuda.MemPool(use_on_oom=True), "use_on_oom")


def test_mempool_no_split():
    expect_unsupported(lambda: torch.cuda.MemPool(no_split=True), "no_split")


def test_disabling_the_caching():
    try:
        expect_unsupported(lambda: torch.cuda.memory.caching_allocator_enable(False),
                           r"caching_allocator_enable\(False\)")
    finally:
        torch.cuda.memory.caching_allocator_enable(True)


def test_enabling_the_caching_is_fine():
    torch.cuda.memory.caching_allocator_enable(True)
    x = torch.ones(10, device="cuda")
    assert float(x.sum()) == 10.0
