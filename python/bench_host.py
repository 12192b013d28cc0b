"""Host cost of the allocator under PyTorch: a tight `torch.empty` + `del`
loop at 512 B, 1 MiB and 64 MiB, and a mixed-size loop that replaces one of
many live tensors per iteration, for the native allocator, cachalot through
the C++ shim, and cachalot through CUDAPluggableAllocator. Every
measurement is its own process; the allocators alternate (the order
rotates each repetition), --reps repetitions each, every process pinned
to the same CPU (--cpu: on the H200's host, processes left to the
scheduler landed near 2 or near 4 us per pair whatever their allocator;
one CPU for all takes one difference between them away). The table gives the median and the spread (min..max) of ns
per alloc+free pair over processes, and each mode's difference to native
as the median of the differences within a repetition (paired).

A mode may carry a memory-history setting after a colon: `native:python`
and `shim:python` run with `_record_memory_history(stacks="python",
max_entries=100000)` on (every allocation and free gathers its Python
stack, as PyTorch's default `context="all"` does); each is compared with
native under the same setting. `:entries` records every action with no
stack (`context=None`): the allocator's own bookkeeping of the history,
without the gathering. A process with a history setting also times each
loop with the history off between its rounds, so the history's cost is
also given relative to the same process (the host's processes differ by
up to 2x from one to the next); with the plain modes in the same run, the
table after the first takes `shim:python` against `native:python` apart
into the history-off difference and each side's relative cost.

    python3 python/bench_host.py [--reps 5] [--modes native,shim,pluggable] [--json out.json]
    python3 python/bench_host.py --modes native,shim,native:python,shim:python

Child (what the driver starts): `--child MODE` prints `RESULT {json}`.
Nothing synchronizes inside the loops: this is host time per pair, the
figure an eager training step pays per tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("512B", "1MiB", "64MiB", "mixed")
SIZES = {"512B": 512, "1MiB": 1 << 20, "64MiB": 64 << 20}


HISTORY = {"python": dict(stacks="python", max_entries=100_000),
           "all": dict(stacks="all", max_entries=100_000),
           # the trace entries alone: every action recorded, no stack gathered
           # (context=None), which splits the history's cost into the
           # allocator's bookkeeping and the gathering of contexts
           "entries": dict(context=None, stacks="python", max_entries=100_000)}


def child(mode: str, iters: int, cpu: int | None) -> dict:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch

    full_mode = mode
    mode, _, history = mode.partition(":")
    if history and history not in HISTORY:
        raise SystemExit(f"unknown history setting {history!r} ({', '.join(HISTORY)})")
    if mode != "native":
        sys.path.insert(0, str(HERE))
        import cachalot_torch

        cachalot_torch.install(mode=mode)
    dev = torch.device("cuda", 0)
    torch.empty(1, device=dev)

    def record(on: bool) -> None:
        if history:
            torch.cuda.memory._record_memory_history(**HISTORY[history] if on else {"enabled": None})

    record(True)
    out = {"mode": full_mode, "backend": torch.cuda.memory.get_allocator_backend(), "cpu": cpu}
    for case in CASES:
        if case == "mixed":
            rng = random.Random(5)
            sizes = [rng.choice([512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 40 << 20]) for _ in range(4096)]
            live = [torch.empty(s, dtype=torch.uint8, device=dev) for s in sizes[:500]]
            slots = [rng.randrange(500) for _ in range(iters)]

            def loop(n):
                for i in range(n):
                    live[slots[i]] = torch.empty(sizes[i & 4095], dtype=torch.uint8, device=dev)
        else:
            size = SIZES[case]

            def loop(n):
                for _ in range(n):
                    x = torch.empty(size, dtype=torch.uint8, device=dev)
                    del x
        loop(min(iters, 2000))  # warm the cache

        def timed() -> float:
            t0 = time.perf_counter_ns()
            loop(iters)
            return (time.perf_counter_ns() - t0) / iters

        best, off = [], []
        for _ in range(3):
            if history:
                # the same loop with the history off, in this process
                # (see in_process)
                record(False)
                off.append(timed())
                record(True)
            best.append(timed())
        out[case] = statistics.median(best)
        if history:
            out[case + ":off"] = statistics.median(off)
        if case == "mixed":
            del live
        torch.cuda.synchronize()
    if history:
        # the history really recorded (a stack on the last allocation)
        trace = torch.cuda.memory._snapshot()["device_traces"][0]
        allocs = [e for e in trace if e["action"] == "alloc"]
        out["history_entries"] = len(trace)
        out["history_frames"] = bool(allocs and allocs[-1].get("frames"))
        torch.cuda.memory._record_memory_history(None)
    return out


def run_child(mode: str, iters: int, cpu: int | None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--iters", str(iters)]
    cmd += ["--cpu", "none" if cpu is None else str(cpu)]
    # one string hash for every process (a dict's layout, and so the
    # interpreter's own work per iteration, follows it)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(p.stdout[-3000:] + p.stderr[-6000:])
    raise RuntimeError(f"{mode}: no RESULT (exit {p.returncode})")


def pin_cpu(arg: str) -> int | None:
    """The CPU `--cpu` names; None for `none` (or where affinity is unknown)."""
    if arg == "none" or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    if arg == "auto":
        return max(allowed)
    try:
        cpu = int(arg)
    except ValueError:
        raise SystemExit(f"--cpu: {arg!r} is not a number, auto or none")
    if cpu not in allowed:
        raise SystemExit(f"--cpu {cpu}: not one of the CPUs this process may use {sorted(allowed)}")
    return cpu


def paired(mine: list[dict], base: list[dict], case: str) -> float:
    """The median over repetitions of this mode's figure minus its base's
    in the same repetition."""
    return statistics.median(a[case] - b[case] for a, b in zip(mine, base))


def in_process(runs: list[dict], case: str) -> float:
    """The history's cost relative to the same process's figure with the
    history off: the median over processes of on / off - 1. A process's
    speed is one state for its whole life (on the H200's host some run at
    about 1.9 us a pair and some at about 3.8, whatever their allocator),
    so a ratio within one process does not see which state it drew."""
    return statistics.median(r[case] / r[case + ":off"] - 1 for r in runs)


def decomposed(runs: dict[str, list[dict]], mode: str, base: str, plain: str,
               plain_base: str, case: str) -> tuple[float, float, float]:
    """`mode` against `base` (native under the same history setting) taken
    apart: the paired difference with the history off (`plain` against
    `plain_base`, in ns), and each side's in-process relative cost of the
    history. Returns (off difference ns, mode's relative cost, base's);
    `mode` costs no more than `base` when the first is <= 0 and the second
    <= the third: off(mode) * (1 + cost(mode)) <= off(base) * (1 + cost(base))."""
    return (paired(runs[plain], runs[plain_base], case), in_process(runs[mode], case),
            in_process(runs[base], case))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", default=None, help="one measurement process of this mode")
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", default="native,shim,pluggable")
    ap.add_argument("--json", default=None)
    ap.add_argument("--cpu", default="auto",
                    help="the CPU every measurement process is pinned to: a number, "
                         "auto (the highest this process may run on) or none")
    args = ap.parse_args()
    cpu = pin_cpu(args.cpu)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.iters, cpu)), flush=True)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for rep in range(args.reps):
        order = modes[rep % len(modes):] + modes[:rep % len(modes)]
        for m in order:
            runs[m].append(run_child(m, args.iters, cpu))
        print(f"bench_host: repetition {rep + 1}/{args.reps} done", flush=True)
    med = {m: {c: statistics.median(r[c] for r in runs[m]) for c in CASES} for m in modes}
    def base(m: str) -> str:
        # native under the same history setting
        _, _, h = m.partition(":")
        return f"native:{h}" if h else "native"

    compared = [m for m in modes if base(m) != m]
    print(f"\n| case | " + " | ".join(f"{m} ns/pair median (min..max)" for m in modes)
          + " | " + " | ".join(f"{m} - {base(m)} (paired median)" for m in compared) + " |")
    print("|---|" + "---|" * (len(modes) + len(compared)))
    for c in CASES:
        cells = []
        for m in modes:
            vals = [r[c] for r in runs[m]]
            cells.append(f"{med[m][c]:.0f} ({min(vals):.0f}..{max(vals):.0f})")
        diffs = [f"{paired(runs[m], runs[base(m)], c):+.0f} ns" if base(m) in runs else "n/a"
                 for m in modes if base(m) != m]
        print(f"| {c} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    # the history's cost taken apart (see decomposed), where the modes
    # without the history ran too
    for m in compared:
        if ":" not in m:
            continue
        plain, b = m.partition(":")[0], base(m)
        if b not in runs or plain not in runs or "native" not in runs:
            continue
        if not all(c + ":off" in r for r in runs[m] + runs[b] for c in CASES):
            continue
        print(f"\n{m} against {b}, taken apart: {plain} - native with the history off (paired "
              f"median), and the history's cost in each process relative to its own figure "
              f"with the history off (median of on / off - 1)")
        print(f"| case | {plain} - native, off | {m} cost | {b} cost | {m} <= {b} |")
        print("|---|---|---|---|---|")
        for c in CASES:
            d, mine, theirs = decomposed(runs, m, b, plain, "native", c)
            ok = d <= 0 and mine <= theirs
            print(f"| {c} | {d:+.0f} ns | {mine:+.1%} | {theirs:+.1%} | {'yes' if ok else 'no'} |")
    for m in modes:
        if ":" in m and not m.endswith(":entries"):
            ok = all(r.get("history_frames") for r in runs[m])
            print(f"{m}: history recorded with frames in every process: {'yes' if ok else 'NO'}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
