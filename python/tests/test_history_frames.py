"""Memory history with stack frames (`_record_memory_history(context=...,
stacks=..., skip_actions=...)`), the `_memory_viz` views of it, and the
profiler's memory events: what the allocator under test must hand PyTorch
so that PyTorch's own code produces the frames, the plots and the events.
"""

import base64
import copy
import json
import pickle
import re

import torch
from torch.cuda import _memory_viz

N = 311 * 411  # floats: a request no other allocation of these tests makes
# (a test that fails keeps its tensors alive in pytest's report: each test
# below asks for its own size, so that one failure does not cascade)


def _snapshot_of_plot(html: str) -> dict:
    """The snapshot a `_memory_viz` HTML page embeds (base64 of a pickle)."""
    m = re.search(r'"base64": "([A-Za-z0-9+/=]+)"', html)
    assert m, "no embedded snapshot in the page"
    return pickle.loads(base64.b64decode(m.group(1)))


def _names(frames) -> list:
    return [f["name"] for f in frames]


def _block(snap: dict, requested: int) -> dict:
    hits = [b for s in snap["segments"] for b in s["blocks"]
            if b["state"] == "active_allocated" and b["requested_size"] == requested]
    assert len(hits) == 1, hits
    return hits[0]


def allocate_in_named_function(n=N):
    return torch.empty(n, dtype=torch.float32, device="cuda")


BIG = 3 * (1 << 20) + 7  # floats: over 10 MiB, a segment of its own


def test_block_frames_name_the_allocating_function():
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history("state", stacks="python")
    try:
        x = allocate_in_named_function(BIG)
        snap = torch.cuda.memory._snapshot()
        b = _block(snap, BIG * 4)
        frames = b["frames"]
        assert frames and "test_history_frames" in frames[0]["filename"], frames[:3]
        assert "allocate_in_named_function" in _names(frames)
        assert "test_block_frames_name_the_allocating_function" in _names(frames)
        assert {"name", "filename", "line"} <= set(frames[0])
        # the block's address, as the viewer computes it, is the tensor's
        for s in snap["segments"]:
            at = s["address"]
            for blk in s["blocks"]:
                if blk is b:
                    assert at == x.untyped_storage().data_ptr()
                at += blk["size"]
        assert "frames" in snap["segments"][0]
        # "state" keeps one entry: after empty_cache it is the release of
        # the tensor's segment (no other block shares it)
        del x
        torch.cuda.empty_cache()
        last = torch.cuda.memory._snapshot()["device_traces"][0][-1]
        assert last["action"] in ("segment_free", "segment_unmap"), last
    finally:
        torch.cuda.memory._record_memory_history(None)


def thealloc():
    return torch.empty(N, dtype=torch.float32, device="cuda")


def thefree(x):
    del x[0]


def test_trace_plot_and_flamegraph_views_carry_the_frames():
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(context="all", stacks="python")
    try:
        keep = thealloc()
        box = [thealloc()]
        thefree(box)
        snap = torch.cuda.memory._snapshot()
        trace = snap["device_traces"][0]
        allocs = [e for e in trace if e["action"] == "alloc" and e["size"] == N * 4]
        assert len(allocs) == 2 and all("thealloc" in _names(e["frames"]) for e in allocs)
        frees = [e for e in trace if e["action"] == "free_requested" and e["size"] == N * 4]
        assert len(frees) == 1 and "thefree" in _names(frees[0]["frames"]), frees
        assert all(e["compile_context"] == "N/A" and e["user_metadata"] == "" for e in trace)
        # (filter_freed edits the snapshot it is given: each view gets a copy)
        for html in (_memory_viz.trace_plot(copy.deepcopy(snap)),
                     _memory_viz.trace_plot(copy.deepcopy(snap), filter_freed=True),
                     _memory_viz.segment_plot(copy.deepcopy(snap))):
            assert "<html" in html.lower() or "<script" in html.lower()
            text = json.dumps(_snapshot_of_plot(html), default=str)
            assert "thealloc" in text
        assert "thefree" in json.dumps(_snapshot_of_plot(_memory_viz.trace_plot(snap)))
        # the flamegraph views' input (folded stacks; the SVG step needs a download)
        lines = _memory_viz.memory(snap, format_flamegraph=lambda s: s)
        assert "thealloc" in lines and "test_history_frames.py" in lines
        segs = _memory_viz.segments(snap, format_flamegraph=lambda s: s)
        assert "active_allocated;" in segs and "thealloc" in segs
        before = torch.cuda.memory._snapshot()["segments"]
        del keep
        torch.cuda.empty_cache()
        after = torch.cuda.memory._snapshot()["segments"]
        diff = _memory_viz.compare(before, after, format_flamegraph=lambda s: s)
        assert isinstance(diff, str)
        assert _memory_viz.trace(snap)
        assert _memory_viz.segsum(snap)
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_dump_snapshot_pickle_has_frames(tmp_path):
    torch.cuda.memory._record_memory_history(stacks="python")
    try:
        x = allocate_in_named_function(N + 1)
        path = tmp_path / "snap.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        assert "allocate_in_named_function" in _names(_block(loaded, (N + 1) * 4)["frames"])
        del x
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_context_levels_decide_which_stacks_are_kept():
    for context in ("alloc", "all", "state"):
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(context=context)
        try:
            box = [thealloc()]
            thefree(box)
            text = json.dumps(torch.cuda.memory._snapshot())
            assert ("thefree" in text) == (context == "all"), context
            assert ("thealloc" in text) == (context != "state"), context
        finally:
            torch.cuda.memory._record_memory_history(None)


def test_context_none_stops_stacks_and_on_again_keeps_the_history():
    def should_capture1():
        return torch.empty(4, 4, device="cuda")

    def should_not_capture():
        return torch.empty(3, 4, device="cuda")

    def should_capture2():
        return torch.empty(4, 4, device="cuda")

    torch.cuda.memory._record_memory_history(context="all", stacks="python")
    try:
        x = should_capture1()
        torch.cuda.memory._record_memory_history(context=None)
        x = should_not_capture()
        torch.cuda.memory._record_memory_history(context="all", stacks="python")
        x = should_capture2()
        text = json.dumps(torch.cuda.memory._snapshot())
        assert "should_capture1" in text and "should_capture2" in text
        assert "should_not_capture" not in text
        del x
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_skip_actions_are_left_out():
    for skip in (["free_requested"], ["free_requested", "free_completed"], ["alloc"],
                 ["segment_alloc", "segment_free"], [], None):
        torch.cuda.empty_cache()
        torch.cuda.memory._record_memory_history(context="all", stacks="python", skip_actions=skip)
        try:
            x = torch.rand(128, 128, device="cuda")
            del x
            torch.cuda.empty_cache()
            trace = torch.cuda.memory._snapshot()["device_traces"][0]
            assert trace, skip
            actions = {e["action"] for e in trace}
            assert not actions & set(skip or []), (skip, actions)
            assert actions - set(skip or []), (skip, actions)
            if not skip:
                assert {"alloc", "free_requested", "free_completed"} <= actions, actions
        finally:
            torch.cuda.memory._record_memory_history(None)


def test_unknown_skip_action_is_refused():
    try:
        raised = None
        try:
            torch.cuda.memory._record_memory_history(skip_actions=["free"])
        except RuntimeError as e:
            raised = str(e)
        assert raised is not None and "Unknown TraceEntry action: free" in raised, raised
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_cpp_frames_with_stacks_all():
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history("state", stacks="all")
    try:
        x = torch.rand(313, 411, device="cuda")
        b = _block(torch.cuda.memory._snapshot(), 313 * 411 * 4)
        assert "::rand" in str(b["frames"]), _names(b["frames"])[:20]
        assert "test_cpp_frames_with_stacks_all" in _names(b["frames"])
        del x
    finally:
        torch.cuda.memory._record_memory_history(None)


def test_user_metadata_and_annotations():
    torch.cuda.empty_cache()
    torch.cuda.memory._set_memory_metadata("metadata test")
    torch.cuda.memory._record_memory_history(context="all")
    try:
        with torch.profiler.record_function("annotated_region"):
            x = torch.empty(1000, device="cuda")
            del x
        torch.cuda.empty_cache()
        torch.cuda.memory._set_memory_metadata("")
        snap = torch.cuda.memory._snapshot()
        trace = snap["device_traces"][0]
        assert trace and all(e["user_metadata"] == "metadata test" for e in trace)
        ann = [a for a in snap["external_annotations"] if a.get("name") == "annotated_region"]
        assert {a["stage"] for a in ann} == {"START", "END"}, snap["external_annotations"]
        assert all(a["device"] == 0 and a["time_us"] > 0 for a in ann)
    finally:
        torch.cuda.memory._set_memory_metadata("")
        torch.cuda.memory._record_memory_history(None)


def test_profiler_memory_events_are_reported_and_balanced():
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        x = torch.rand(128, 128, device="cuda")
        y = x * x + x * x
        del x, y

    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    events = [n.extra_fields for n in walk(prof.profiler.kineto_results.experimental_event_tree())
              if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cuda"]
    assert events, "no CUDA memory event"
    live = {}
    for e in events:
        assert e.alloc_size != 0 and e.alloc_size % 512 == 0, e.alloc_size
        assert e.total_reserved >= e.total_allocated >= base
        if e.alloc_size > 0:
            live[e.ptr] = e.alloc_size
        else:
            assert live.pop(e.ptr) == -e.alloc_size
    assert not live, "every allocation freed inside the profile"
    assert sum(e.alloc_size for e in events) == 0
    assert events[-1].total_allocated == base
    # PyTorch's own view of them
    snap = _memory_viz._profile_to_snapshot(prof)
    text = json.dumps(snap)
    assert "test_history_frames.py" in text or "test_profiler_memory_events" in text
    assert "category" in text
    assert _memory_viz.profile_plot(prof)
