"""Where the memory history's frames land, native PyTorch against cachalot,
on the GPU machine: one process per allocator, from the repository root.

    python3 scripts/device/history_frames.py native|cachalot free_stack|plots|skip|dump

free_stack  PyTorch's test_memory_plots_free_stack program: for each context
            level, which segments, blocks and trace entries carry the
            allocating ("thealloc") and the freeing ("thefree") function
plots       PyTorch's test_memory_plots program: the three checks it makes,
            after the _memory_viz calls (filter_freed edits the snapshot)
skip        an unknown skip action: the error raised (or the crash)
dump        the snapshot of `x = torch.rand(128, 128); x * x + x * x`,
            segments, blocks and entries one a line (frames: names only)
cachalot needs CACHALOT_CAPI_LIB (see scripts/device/dropin.sh).
"""
import json, sys, os, traceback
alloc = sys.argv[1]
what = sys.argv[2]
import torch
if alloc == "cachalot":
    sys.path.insert(0, "python")
    import cachalot_torch
    cachalot_torch.install()
torch.ones(1, device="cuda")
def where(ss, word):
    hits = []
    for s in ss["segments"]:
        if word in json.dumps(s.get("frames", [])): hits.append(("segment", s["address"], s.get("total_size")))
        for b in s["blocks"]:
            if word in json.dumps(b.get("frames", [])): hits.append(("block", b["address"], b["state"], b["size"]))
    for t in ss["device_traces"][0] if ss["device_traces"] else []:
        if word in json.dumps(t.get("frames", [])): hits.append(("trace", t["action"], t["addr"], t["size"]))
    return hits
if what == "skip":
    for stacks in ["python", "all"]:
        try:
            torch.cuda.memory._record_memory_history(skip_actions=["free"], stacks=stacks)
            print("skip", stacks, "no error")
        except Exception as e:
            print("skip", stacks, type(e).__name__, str(e)[:200])
        finally:
            torch.cuda.memory._record_memory_history(None)
        sys.stdout.flush()
elif what == "free_stack":
    for context in ["alloc", "all", "state"]:
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._record_memory_history(context=context)
        x = None
        def thealloc():
            global x
            x = torch.rand(3, 4, device="cuda")
        def thefree():
            global x
            del x
        thealloc(); thefree()
        ss = torch.cuda.memory._snapshot()
        print(context, "thefree:", where(ss, "thefree"), "thealloc:", where(ss, "thealloc"))
        torch.cuda.memory._record_memory_history(None)
elif what == "plots":
    from torch.cuda._memory_viz import trace_plot, segment_plot
    def test_memory_plots():
      for context, stacks in (("all", "all"), ("all", "python"), (None, "python")):
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks)
        def run():
            x = torch.rand(128, 128, device="cuda")
            x * x + x * x
        run()
        ss = torch.cuda.memory._snapshot()
        trace_plot(ss); trace_plot(ss, filter_freed=True); segment_plot(ss)
        text = json.dumps(ss)
        print(context, stacks, "name in text:", "test_memory_plots" in text, "::rand:", "::rand" in text,
              "size:", str(128*128*4) in text, "where name:", where(ss, "test_memory_plots")[:6])
        torch.cuda.memory._record_memory_history(None)
    test_memory_plots()
elif what == "dump":
    torch.cuda.memory.empty_cache()
    torch.cuda.memory._record_memory_history("all", context="all", stacks="python")
    def run():
        x = torch.rand(128, 128, device="cuda")
        x * x + x * x
    run()
    ss = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(None)
    def short(fr):
        return [f["name"] for f in fr][:6]
    for s in ss["segments"]:
        print("SEG", {k: v for k, v in s.items() if k not in ("blocks", "frames")}, "frames", short(s.get("frames", [])))
        for b in s["blocks"]:
            print("   BLK", {k: v for k, v in b.items() if k != "frames"}, short(b.get("frames", [])))
    for t in ss["device_traces"][0]:
        print("TR", {k: v for k, v in t.items() if k not in ("frames",)}, short(t.get("frames", [])))
else:
    raise SystemExit(f"unknown program {what!r}")
