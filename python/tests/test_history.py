"""_record_memory_history + _snapshot / _dump_snapshot: a snapshot with
segments and alloc/free trace entries that torch.cuda._memory_viz renders."""

import pickle

import torch
from torch.cuda import _memory_viz

MiB = 1 << 20


def test_history_snapshot_and_viz(tmp_path):
    torch.cuda.memory._record_memory_history()  # defaults: max_entries=sys.maxsize
    try:
        assert torch._C._cuda_isHistoryEnabled()
        x = torch.empty(311 * 411, dtype=torch.float32, device="cuda")
        y = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        ptr = x.data_ptr()
        del y
        snap = torch.cuda.memory._snapshot()
        assert {"segments", "device_traces"} <= set(snap)
        blocks = [(s["address"], s) for s in snap["segments"]]
        assert blocks
        found = False
        for seg in snap["segments"]:
            a = seg["address"]
            for b in seg["blocks"]:
                if a == ptr:
                    assert b["state"] == "active_allocated"
                    assert b["requested_size"] == 311 * 411 * 4
                    found = True
                a += b["size"]
        assert found
        trace = snap["device_traces"][0]
        actions = [e["action"] for e in trace]
        assert "alloc" in actions and "free_requested" in actions and "free_completed" in actions
        assert any(e["action"] == "alloc" and e["addr"] == ptr for e in trace)
        del x
        torch.cuda.empty_cache()
        after = torch.cuda.memory._snapshot()["device_traces"][0]
        # fixed segments are freed; pages of expandable ones are unmapped
        assert any(e["action"] in ("segment_free", "segment_unmap") for e in after)
        path = tmp_path / "snap.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        html = _memory_viz.trace_plot(loaded)
        assert "<html" in html.lower() or "<script" in html.lower()
        assert _memory_viz.segment_plot(loaded)
        assert "segment" in _memory_viz.segsum(loaded).lower() or _memory_viz.segsum(loaded)
        text = _memory_viz.trace(loaded)
        assert text
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert not torch._C._cuda_isHistoryEnabled()
