"""Out of memory raises torch.OutOfMemoryError (cachalot's report in the
message), the device keeps working, a retry after freeing succeeds,
observers are called; the per-process memory fraction caps the process."""

import pytest
import torch

import _setup


def test_out_of_memory_raises_the_typed_error():
    ooms = torch.cuda.memory_stats()["num_ooms"]
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")  # 1 TiB
    assert isinstance(e.value, RuntimeError)
    assert isinstance(e.value, torch.cuda.OutOfMemoryError)
    msg = str(e.value)
    assert "out of memory" in msg and "Tried to allocate" in msg, msg
    if _setup.is_cachalot():
        # cachalot's report: largest free blocks and whether empty_cache helps
        assert "cachalot" in msg and "Largest free block" in msg, msg
    assert torch.cuda.memory_stats()["num_ooms"] == ooms + 1
    # the device still works
    x = torch.ones(1000, device="cuda")
    assert float((x * 2).sum()) == 2000.0


def test_absurd_request_raises():
    with pytest.raises(RuntimeError):
        torch.empty(1 << 62, dtype=torch.uint8, device="cuda")


def test_out_of_memory_then_retry_after_free():
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    half = int(free * 0.55)
    a = torch.empty(half, dtype=torch.uint8, device="cuda")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(half, dtype=torch.uint8, device="cuda")
    del a
    b = torch.empty(half, dtype=torch.uint8, device="cuda")
    del b
    torch.cuda.empty_cache()


def test_oom_observer_is_called():
    seen = []

    def obs(device, alloc, device_alloc, device_free):
        seen.append((device, alloc, device_alloc, device_free))

    torch._C._cuda_attach_out_of_memory_observer(obs)
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    assert seen and seen[-1][0] == 0 and seen[-1][1] >= 1 << 40


def test_memory_fraction_round_trip_and_checks():
    try:
        for f in (0.0, 0.25, 0.7, 1.0):
            torch.cuda.set_per_process_memory_fraction(f)
            assert torch.cuda.get_per_process_memory_fraction() == pytest.approx(f)
        with pytest.raises(TypeError):
            torch.cuda.set_per_process_memory_fraction(1)
        with pytest.raises(ValueError):
            torch.cuda.set_per_process_memory_fraction(1.5)
        with pytest.raises(ValueError):
            torch.cuda.set_per_process_memory_fraction(-0.1)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def test_memory_fraction_caps_allocations():
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    used = torch.cuda.memory_reserved()
    try:
        torch.cuda.set_per_process_memory_fraction(0.5)
        ok = torch.empty(int(total * 0.499) - used, dtype=torch.uint8, device="cuda")
        del ok
        torch.cuda.empty_cache()
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")
        assert "out of memory" in str(e.value)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    x = torch.empty(int(total * 0.6), dtype=torch.uint8, device="cuda")
    del x
