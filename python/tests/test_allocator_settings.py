"""Settings set from Python (torch.cuda.memory._set_allocator_settings) take
effect at once, read back from the snapshot's allocator_settings, and bad
values are ValueErrors; a capture's record_stream reuse follows the
setting (no reuse before the side streams join, reuse after)."""

import contextlib
import os

import pytest
import torch

import _setup

MiB = 1 << 20


def settings():
    return torch.cuda.memory._snapshot()["allocator_settings"]


def active_delta(n_bytes):
    """active_bytes.all.allocated grows by this much for an n_bytes tensor
    (on an empty cache: a cached block of an earlier, larger rounding is
    handed out whole when `max_split_size` keeps it from being split)."""
    torch.cuda.empty_cache()
    before = torch.cuda.memory_stats()["active_bytes.all.allocated"]
    t = torch.empty(n_bytes, dtype=torch.uint8, device="cuda")
    after = torch.cuda.memory_stats()["active_bytes.all.allocated"]
    del t
    return after - before


@contextlib.contextmanager
def restored():
    """Settings back to the defaults afterwards."""
    torch.ones(1, device="cuda")  # the allocator exists
    try:
        yield
    finally:
        torch.cuda.memory._set_allocator_settings("")


def test_rounding_set_at_run_time_applies_at_once_and_reads_back():
    with restored():
        n = 84 * MiB  # between 64 and 128 MiB
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        s = settings()
        assert s["PYTORCH_CUDA_ALLOC_CONF"] == "roundup_power2_divisions:4"
        assert set(s["roundup_power2_divisions"].values()) == {4}
        assert active_delta(n) == 96 * MiB  # 64 MiB + two quarters of 64 MiB
        # the list form: 8 divisions for sizes up to the [64 MiB, 128 MiB)
        # interval, 2 above it
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:[64:8,>:2]")
        assert active_delta(n) == 88 * MiB  # 64 MiB + 8 MiB steps
        assert active_delta(40 * MiB) == 40 * MiB  # 32 MiB + 4 MiB steps: exact
        assert active_delta(41 * MiB) == 44 * MiB
        assert active_delta(130 * MiB) == 192 * MiB  # 128 MiB + halves of 128 MiB
        # every string resets what it does not name
        torch.cuda.memory._set_allocator_settings("max_split_size_mb:40")
        s = settings()
        assert s["max_split_size"] == 40 * MiB
        assert set(s["roundup_power2_divisions"].values()) == {0}
        assert active_delta(n) == n
        torch.cuda.memory._set_allocator_settings("")
        assert settings()["max_split_size"] == -1


def test_keys_of_other_parts_of_pytorch():
    with restored():
        # the pinned host allocator's keys: accepted, the device
        # allocations unchanged, the host allocator configured
        torch.cuda.memory._set_allocator_settings(
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
        s = settings()
        assert s["pinned_num_register_threads"] == 8
        assert s["pinned_use_cuda_host_register"] is True
        assert active_delta(84 * MiB) == 84 * MiB
        try:
            assert torch.ones(1 << 20).pin_memory().is_pinned()
        except RuntimeError:
            pass  # (some machines cannot register host memory)
        torch.cuda.memory._set_allocator_settings("pinned_use_cuda_host_register:False")


def test_release_lock_on_cudamalloc_reads_back_and_threads_allocate():
    """release_lock_on_cudamalloc: read back as set (it is kept by strings
    that do not name it), and with it on, threads allocating new segments
    (the device call made with the allocator's lock released) and cached
    blocks at once, with empty_cache in between, get memory that holds
    what they wrote, and the stats come back to where they were."""
    import threading

    with restored():
        assert settings()["release_lock_on_cudamalloc"] is False
        try:
            torch.cuda.memory._set_allocator_settings("release_lock_on_cudamalloc:True")
            assert settings()["release_lock_on_cudamalloc"] is True
            torch.cuda.memory._set_allocator_settings("max_split_size_mb:40")
            assert settings()["release_lock_on_cudamalloc"] is True
            torch.cuda.synchronize()
            before = torch.cuda.memory_stats()["allocated_bytes.all.current"]
            errors = []

            def work(k):
                try:
                    s = torch.cuda.Stream()
                    with torch.cuda.stream(s):
                        for i in range(24):
                            # over 10 MiB: a segment of its own when not cached
                            big = torch.full(((12 + 3 * k + i) * MiB // 4,), k, dtype=torch.int32,
                                             device="cuda")
                            small = torch.full((4096,), i, dtype=torch.int32, device="cuda")
                            assert bool((big == k).all()) and bool((small == i).all())
                            del big, small
                            if k == 0 and i % 8 == 7:
                                torch.cuda.empty_cache()
                    s.synchronize()
                except Exception as e:  # noqa: BLE001 (reported below)
                    errors.append(repr(e))

            threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            torch.cuda.synchronize()
            assert torch.cuda.memory_stats()["allocated_bytes.all.current"] == before
        finally:
            torch.cuda.memory._set_allocator_settings("release_lock_on_cudamalloc:False")
        assert settings()["release_lock_on_cudamalloc"] is False


def test_bad_settings_are_value_errors():
    with restored():
        for bad in ("no_such_key:1", "garbage_collection_threshold:1.5", "max_split_size_mb:3",
                    "expandable_segments:maybe", "roundup_power2_divisions:3"):
            with pytest.raises(ValueError):
                torch._C._accelerator_setAllocatorSettings(bad)


def test_cachalot_keys_pass_through_pytorch():
    with restored():
        if _setup.is_cachalot():
            torch.cuda.memory._set_allocator_settings("placement:steady,idle_stream_reuse:True")
            assert "placement:steady" in settings()["PYTORCH_CUDA_ALLOC_CONF"]
            # PyTorch knows the key now, cachalot checks the value
            with pytest.raises(ValueError, match="cachalot"):
                torch.cuda.memory._set_allocator_settings("placement:anywhere")
            # back to what the run started with
            start = "pytorch" if "placement:pytorch" in os.environ.get("CACHALOT_ALLOC_CONF", "") else "steady"
            torch.cuda.memory._set_allocator_settings(f"placement:{start},idle_stream_reuse:False")
        else:
            with pytest.raises(ValueError, match="Unrecognized key"):
                torch.cuda.memory._set_allocator_settings("placement:steady")


def _join_program(side_streams):
    """Captures: x on the main stream, read by every side stream (each
    recording the use), freed; y allocated before the last side stream has
    joined; z after all joined. Returns (x, y, z) addresses."""
    main = torch.cuda.Stream()
    sides = [torch.cuda.Stream() for _ in range(side_streams)]
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(main):
        g.capture_begin()
        keep = torch.zeros(16, device="cuda")
        x = torch.ones(16, device="cuda")
        xa = x.data_ptr()
        outs = []
        for s in sides:
            s.wait_stream(main)
            with torch.cuda.stream(s):
                outs.append(x * 2)
                x.record_stream(s)
        del x
        for s in sides[:-1]:
            main.wait_stream(s)
        keep.add_(1)
        y = torch.empty(16, device="cuda")
        main.wait_stream(sides[-1])
        keep.add_(1)
        z = torch.empty(16, device="cuda")
        g.capture_end()
    torch.cuda.synchronize()
    return xa, y.data_ptr(), z.data_ptr()


@pytest.mark.parametrize("side_streams", [1, 3])
def test_capture_reuse_follows_the_setting(side_streams):
    with restored():
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:True")
        assert settings()["graph_capture_record_stream_reuse"] is True
        x, y, z = _join_program(side_streams)
        assert y != x, "reused before every stream that used it joined"
        assert z == x, "not reused once every stream joined"
        torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
        assert settings()["graph_capture_record_stream_reuse"] is False
        x, y, z = _join_program(side_streams)
        assert z != x, "reused during capture with the setting off"
