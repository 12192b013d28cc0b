"""Prints the result table of python/run_gpu_suite.sh from the files under
$OUT: test outcomes per allocator (and tests whose outcome differs), values
compared across the allocators, the host-cost table and the training table."""

import json
import sys
from pathlib import Path


def load(p):
    p = Path(p)
    return json.loads(p.read_text()) if p.is_file() else None


def main(out: str) -> int:
    out = Path(out)
    ok = True
    print("\n================ cachalot PyTorch drop-in: results ================")
    build = (out / "build.txt").read_text().strip() if (out / "build.txt").is_file() else "?"
    print(f"shim build: {build}")
    tests = {a: load(out / f"tests-{a}.json") for a in ("native", "cachalot")}
    print("\n| allocator | passed | failed | skipped | seconds |")
    print("|---|---|---|---|---|")
    for a, rs in tests.items():
        if rs is None:
            print(f"| {a} | - | - | - | no results (crashed or timed out?) |")
            ok = False
            continue
        c = {s: sum(r["status"] == s for r in rs) for s in ("passed", "failed", "skipped")}
        ok &= c["failed"] == 0 and c["passed"] > 0
        print(f"| {a} | {c['passed']} | {c['failed']} | {c['skipped']} | {sum(r['seconds'] for r in rs):.1f} |")
    if all(tests.values()):
        by = {a: {r["test"]: r["status"] for r in rs} for a, rs in tests.items()}
        names = sorted(set(by["native"]) | set(by["cachalot"]))
        diff = [n for n in names if by["native"].get(n) != by["cachalot"].get(n)]
        failed = [n for n in names if "failed" in (by["native"].get(n), by["cachalot"].get(n))]
        if diff or failed:
            print("\n| test | native | cachalot |")
            print("|---|---|---|")
            for n in sorted(set(diff) | set(failed)):
                print(f"| {n} | {by['native'].get(n, '-')} | {by['cachalot'].get(n, '-')} |")
        for a, rs in tests.items():
            for r in rs:
                if r["status"] == "failed":
                    first = [ln for ln in r["message"].splitlines() if ln.strip()][-3:]
                    print(f"  {a} FAILED {r['test']}: {' / '.join(first)[:300]}")
    rn, rc = load(out / "results-native.json"), load(out / "results-cachalot.json")
    if rn and rc:
        print("\n| value | native | cachalot | same |")
        print("|---|---|---|---|")
        for k in sorted(set(rn) | set(rc)):
            same = rn.get(k) == rc.get(k)
            ok &= same
            print(f"| {k} | {str(rn.get(k))[:20]} | {str(rc.get(k))[:20]} | {'yes' if same else 'NO'} |")
    for name, title in (("bench.log", "host cost (ns per torch.empty+del pair)"), ("train.log", "training")):
        p = out / name
        print(f"\n-- {title} --")
        if not p.is_file():
            print("(missing)")
            ok = False
            continue
        lines = p.read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith("|") or "CHECKS" in ln or ln.startswith("== ")]
        print("\n".join(keep) if keep else "\n".join(lines[-15:]))
        if name == "train.log" and not any("ALL CHECKS PASSED" in ln for ln in lines):
            ok = False
    print("\nSUITE OK" if ok else "\nSUITE HAS FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
