"""Step time of real PyTorch clients with random shapes on four allocators
(issue 39, item 3): PyTorch's default mode, PyTorch's
`expandable_segments:True`, cachalot's default and cachalot's fixed segments
(`expandable_segments:False`), each run in its own process, the processes
alternating (the order rotates every repetition), the same random shapes in
every process.

Workloads (random weights, fixed seeds, no downloads; deterministic
algorithms, so every allocator must give the same outputs bit for bit):
- `bert`: BERT-base inference (fp32, no grad), one request = random batch
  1..48 x length 16..512; the step is one request.
- `generate`: GPT-2 small `generate` (greedy, KV cache), one request =
  random batch 1..8, prompt 8..128 tokens, 8..64 new tokens; the step is
  one request.
- `train`: a Llama-style decoder (transformers `LlamaForCausalLM`, 6
  layers, 512 wide, eager attention, bf16 autocast, AdamW), one step = random batch 1..16 x
  length 64..512: zero_grad, forward, backward, optimizer step.

A step is timed with `torch.cuda.synchronize()` before and after (wall
clock between). Each process reports the median of its steps after the
first WARMUP (cold start: cuBLAS handles, lazy module loading, the
allocator's first segments) and its peak reserved bytes; the table gives,
per workload and allocator, the median over processes of those medians and
their spread (min..max), and checks what issue 39 accepts: cachalot's
default median step <= PyTorch's default and <= fixed segments' + 1%, its
peak reserved <= PyTorch's expandable mode, and every output identical.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 python/client_speed.py \\
        --lib dist/cuda/lib/libcachalot_capi.so [--workloads bert,generate,train] [--reps 3]

One run (what the driver starts) prints `RESULT {json}`:

    python3 python/client_speed.py --run train --allocator cachalot --lib ...

The JSON (`--json`) is written after every process, so a run cut short
keeps what it measured: `--summarize FILE` prints its table.

Exit: 1 when an output differs from native's or a run fails; with
`--strict` also when a timing or memory check misses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the four allocators (name, allocator, config), how a run's process is
# started and how it sets torch up: as for the clients' memory
from client_memory import WAYS, child_result, prepare_torch  # noqa: E402
WORKLOADS = ("bert", "generate", "train")
# steps per process and warm-up steps left out of the median, per workload
STEPS = {"bert": 120, "generate": 16, "train": 40}
WARMUP = {"bert": 10, "generate": 3, "train": 5}
# cachalot's default may be this much slower than fixed segments (issue 39)
FIXED_SLACK = 1.01


def _timed(torch, times: list, fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    return out


def _eager(config_cls, **kw):
    """A transformers config with eager attention (older versions take no
    `attn_implementation` argument)."""
    try:
        return config_cls(attn_implementation="eager", **kw)
    except TypeError:
        cfg = config_cls(**kw)
        cfg._attn_implementation = "eager"
        return cfg


def run_bert(torch, steps: int, times: list, digest) -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    m = BertModel(BertConfig()).to("cuda").eval()
    rng = random.Random(1234)
    with torch.no_grad():
        for _ in range(steps):
            b, s = rng.randint(1, 48), rng.randint(16, 512)
            ids = torch.randint(0, 30522, (b, s), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
            ids = ids.to("cuda")
            out = _timed(torch, times, lambda: m(input_ids=ids).last_hidden_state)
            digest.update(float(out.double().sum().item()).hex().encode())
            del out, ids


def run_generate(torch, steps: int, times: list, digest) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config()
    m = GPT2LMHeadModel(cfg).to("cuda").eval()
    rng = random.Random(4321)
    with torch.no_grad():
        for _ in range(steps):
            b, p, n = rng.randint(1, 8), rng.randint(8, 128), rng.randint(8, 64)
            ids = torch.randint(0, cfg.vocab_size, (b, p),
                                generator=torch.Generator().manual_seed(rng.randrange(1 << 30))).to("cuda")
            out = _timed(torch, times, lambda: m.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                max_new_tokens=n, min_new_tokens=n, pad_token_id=0))
            digest.update(repr(out.cpu().tolist()).encode())
            del out, ids


def run_train(torch, steps: int, times: list, digest) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = _eager(LlamaConfig, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                 num_attention_heads=8, num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
    m = LlamaForCausalLM(cfg).to("cuda").train()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    rng = random.Random(2468)

    def step(ids):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(steps):
        b, s = rng.randint(1, 16), rng.randint(64, 512)
        ids = torch.randint(0, cfg.vocab_size, (b, s),
                            generator=torch.Generator().manual_seed(rng.randrange(1 << 30))).to("cuda")
        loss = _timed(torch, times, lambda: step(ids))
        digest.update(float(loss.float().item()).hex().encode())
        del loss, ids


RUNNERS = {"bert": run_bert, "generate": run_generate, "train": run_train}


def run_one(workload: str, allocator: str, config: str | None, lib: str | None, steps: int) -> dict:
    torch = prepare_torch(allocator, config, lib)
    times: list[float] = []
    digest = hashlib.sha256()
    RUNNERS[workload](torch, steps, times, digest)
    st = torch.cuda.memory_stats(0)
    return {
        "workload": workload,
        "allocator": allocator,
        "config": config,
        "backend": torch.cuda.memory.get_allocator_backend(),
        "step_s": times,
        "outputs": digest.hexdigest(),
        "peak_reserved": st["reserved_bytes.all.peak"],
        "peak_allocated": st["allocated_bytes.all.peak"],
        "num_device_alloc": st.get("num_device_alloc"),
    }


def child(workload: str, way: tuple, args) -> dict:
    name, allocator, config = way
    r, p = child_result(Path(__file__).resolve(),
                        ["--run", workload, "--steps", str(args.steps or STEPS[workload])],
                        allocator, config, args.lib)
    if r is not None:
        return dict(r, way=name)
    raise RuntimeError(f"{workload}/{name}: no result (rc {p.returncode})\n{p.stderr[-3000:]}")


def process_median(r: dict, warmup: int) -> float:
    """The median step of one process, its first `warmup` steps left out."""
    t = r["step_s"][warmup:] or r["step_s"]
    return statistics.median(t)


def summarize(runs: list[dict], warmup: dict | None = None) -> tuple[list[str], bool, bool]:
    """The table and the checks of a driver's runs: (lines, outputs all
    identical to native's, every check passed)."""
    warmup = warmup or WARMUP
    lines = ["| workload | allocator | median step ms (min..max over processes) | x native "
             "| peak reserved MiB | outputs = native |", "|---|---|---|---|---|---|"]
    same_all, checks_ok, checks = True, True, []
    for w in [w for w in WORKLOADS if any(r["workload"] == w for r in runs)]:
        per = {}
        for r in runs:
            if r["workload"] == w:
                per.setdefault(r["way"], []).append(r)
        ref = (per.get("native") or next(iter(per.values())))[0]["outputs"]
        med, peak = {}, {}
        for name, rs in per.items():
            ms = [process_median(r, warmup.get(w, 0)) * 1e3 for r in rs]
            med[name] = statistics.median(ms)
            peak[name] = max(r["peak_reserved"] for r in rs)
            same = all(r["outputs"] == ref for r in rs)
            same_all &= same
            x = f"{med[name] / med['native']:.3f}" if "native" in med else ""
            lines.append(f"| {w} | {name} | {med[name]:.2f} ({min(ms):.2f}..{max(ms):.2f}) | {x} "
                         f"| {peak[name] / 2**20:,.0f} | {'yes' if same else 'NO'} |")

        def check(cond: bool, text: str) -> None:
            nonlocal checks_ok
            checks_ok &= cond
            checks.append(f"{w}: {'PASS' if cond else 'MISS'} {text}")

        if "cachalot" in med:
            c = med["cachalot"]
            if "native" in med:
                check(c <= med["native"], f"median step {c:.2f} ms <= native's {med['native']:.2f}")
            if "cachalot-fixed" in med:
                f = med["cachalot-fixed"]
                check(c <= f * FIXED_SLACK, f"median step {c:.2f} ms <= fixed segments' {f:.2f} + 1%")
            if "native-expandable" in peak:
                check(peak["cachalot"] <= peak["native-expandable"],
                      f"peak reserved {peak['cachalot'] / 2**20:,.0f} MiB <= native expandable's "
                      f"{peak['native-expandable'] / 2**20:,.0f}")
    checks.append("outputs identical to native's: " + ("yes" if same_all else "NO"))
    return lines + [""] + checks, same_all, checks_ok and same_all


def drive(args) -> int:
    ways = [x for x in WAYS if x[0] in args.ways.split(",")]
    runs: list[dict] = []
    failed = False
    t0 = time.time()
    for w in args.workloads.split(","):
        try:
            for rep in range(args.reps):
                k = rep % len(ways)
                for way in ways[k:] + ways[:k]:
                    runs.append(child(w, way, args))
                    if args.json:
                        # after every process: a run cut short keeps what it measured
                        Path(args.json).write_text(json.dumps(runs))
                print(f"client_speed: {w} repetition {rep + 1}/{args.reps} done ({time.time() - t0:.0f} s)",
                      flush=True)
        except RuntimeError as e:
            # the other workloads still run; this one's runs are left out
            print(f"client_speed: {w} failed: {e}", flush=True)
            runs = [r for r in runs if r["workload"] != w]
            failed = True
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    lines, same, ok = summarize(runs)
    print("\n".join(lines))
    if not same or failed:
        return 1
    return 1 if args.strict and not ok else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", choices=WORKLOADS, help="one run (child mode)")
    ap.add_argument("--allocator", choices=("native", "cachalot"), default="native")
    ap.add_argument("--config", default=None)
    ap.add_argument("--lib", default="dist/cuda/lib/libcachalot_capi.so")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--ways", default=",".join(w[0] for w in WAYS),
                    help="which of " + ", ".join(w[0] for w in WAYS) + " to run (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="processes per allocator and workload")
    ap.add_argument("--steps", type=int, default=0, help="steps per process (default: per workload)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a timing or memory check misses")
    ap.add_argument("--summarize", metavar="JSON", default=None,
                    help="print the table of an earlier run's --json (also one cut short) and exit")
    args = ap.parse_args()
    unknown = set(args.ways.split(",")) - {w[0] for w in WAYS}
    unknown |= set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        ap.error(f"unknown ways or workloads {sorted(unknown)}")
    if args.reps < 1 or args.reps > 50 or args.steps < 0 or args.steps > 100_000:
        ap.error("--reps must be 1..50 and --steps 0..100000")
    if args.summarize:
        lines, same, ok = summarize(json.loads(Path(args.summarize).read_text()))
        print("\n".join(lines))
        return 0 if same and (ok or not args.strict) else 1
    if args.run:
        r = run_one(args.run, args.allocator, args.config, args.lib, args.steps or STEPS[args.run])
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
