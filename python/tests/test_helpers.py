"""The helpers of cachalot_torch (cachalot's own figures, with torch's
names) read the same numbers as torch in shim mode, and the old names are
deprecated aliases. Needs no GPU: with CACHALOT_BACKEND=mock (and torch
absent) it runs on the mock device."""

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cachalot_torch  # noqa: E402


def test_helpers_read_cachalots_figures():
    st = cachalot_torch.memory_stats(0)
    assert len(st) == 122
    assert cachalot_torch.max_memory_reserved(0) == st["reserved_bytes.all.peak"]
    assert cachalot_torch.memory_reserved(0) == st["reserved_bytes.all.current"]
    assert cachalot_torch.memory_allocated(0) == st["allocated_bytes.all.current"]
    assert cachalot_torch.max_memory_allocated(0) == st["allocated_bytes.all.peak"]
    cachalot_torch.reset_peak_memory_stats()
    cachalot_torch.reset_accumulated_memory_stats(0)
    st = cachalot_torch.memory_stats(0)
    assert st["reserved_bytes.all.peak"] == st["reserved_bytes.all.current"]
    assert st["num_device_alloc"] == 0
    cachalot_torch.empty_cache()
    assert cachalot_torch.backend_name() in ("cuda", "mock")


def test_bad_input_is_a_typed_error():
    with pytest.raises(cachalot_torch.CachalotError) as e:
        cachalot_torch.set_allocator_settings("no_such_key:1")
    assert e.value.code == 6 and "no_such_key" in str(e.value)
    with pytest.raises(cachalot_torch.CachalotError) as e:
        cachalot_torch.memory_stats(99)
    assert e.value.code == 1
    with pytest.raises(ValueError):
        cachalot_torch.install(mode="nonsense")


def test_old_names_are_deprecated_aliases():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cachalot_torch.peak_reserved(0) == cachalot_torch.max_memory_reserved(0)
        cachalot_torch.reset_peak_stats(0)
    assert [x.category for x in w] == [DeprecationWarning, DeprecationWarning]
