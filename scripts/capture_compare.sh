#!/usr/bin/env bash
# Compares `cachalot capture-sim` on the mock with real PyTorch on a GPU:
# for each config and seed, the same random capture program is run by
# cachalot in modes `off` and `pytorch`, and by PyTorch (the script that
# `--emit-pytorch` writes) under PYTORCH_CUDA_ALLOC_CONF=
# graph_capture_record_stream_reuse:False and :True. Prints a table of peak
# reserved bytes (MiB) and whether each pair agrees within one 2 MiB segment.
#
# Agreement criterion (exit 1 when it fails, 0 when it holds):
#   * every run gave its figure (no n/a);
#   * reuse off agrees with PyTorch's False on every program (both are
#     PyTorch's plain algorithm: only segment placement may differ);
#   * with reuse, each (streams, ops) config has at least MIN_AGREE
#     programs (default 3, the acceptance bar) that agree in both modes.
#
# usage: scripts/capture_compare.sh [CACHALOT_BIN]
#   env: SEEDS="1 2 3"  STREAMS="2 4"  OPS="1000 10000"  PYTHON=python3
#        MIN_AGREE=3
set -u
BIN=${1:-target/release/cachalot}
SEEDS=${SEEDS:-"1 2 3"}
STREAMS=${STREAMS:-"2 4"}
OPS=${OPS:-"1000 10000"}
PY=${PYTHON:-python3}
MIN_AGREE=${MIN_AGREE:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rows="$tmp/rows.jsonl"
: >"$rows"
for st in $STREAMS; do
  for ops in $OPS; do
    for seed in $SEEDS; do
      args=(capture-sim --streams "$st" --ops "$ops" --seed "$seed" --json --timing-runs 1)
      "$BIN" "${args[@]}" --reuse off --emit-pytorch "$tmp/prog.py" >"$tmp/off.json" || echo '{}' >"$tmp/off.json"
      "$BIN" "${args[@]}" --reuse pytorch >"$tmp/pt.json" || echo '{}' >"$tmp/pt.json"
      "$BIN" "${args[@]}" --reuse cross-stream >"$tmp/cs.json" || echo '{}' >"$tmp/cs.json"
      # the two PyTorch runs are separate processes: run them side by side
      (PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:False "$PY" "$tmp/prog.py" >"$tmp/tf.json" 2>"$tmp/tf.err" || { tail -3 "$tmp/tf.err" >&2; echo '{}' >"$tmp/tf.json"; }) &
      (PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:True "$PY" "$tmp/prog.py" >"$tmp/tt.json" 2>"$tmp/tt.err" || { tail -3 "$tmp/tt.err" >&2; echo '{}' >"$tmp/tt.json"; }) &
      wait
      "$PY" - "$st" "$ops" "$seed" "$tmp" >>"$rows" <<'PYEOF'
import json, sys
st, ops, seed, d = sys.argv[1:5]
def load(n):
    try:
        return json.loads(open(f"{d}/{n}.json").read().strip().splitlines()[-1])
    except Exception:
        return {}
print(json.dumps(dict(streams=int(st), ops=int(ops), seed=int(seed), off=load("off"),
                      pytorch=load("pt"), cross=load("cs"), torch_false=load("tf"),
                      torch_true=load("tt"))))
PYEOF
    done
  done
done
"$PY" - "$rows" "$MIN_AGREE" <<'PYEOF'
import json, sys
SEG = 2 << 20
M = 2 ** 20
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| streams | ops | seed | torch False | cachalot off | agree | torch True | cachalot pytorch | agree | cachalot cross_stream |")
print("|---|---|---|---|---|---|---|---|---|---|")
ok = 0
missing = off_bad = 0
per_config = {}
for r in rows:
    tf = r["torch_false"].get("peak_reserved"); co = r["off"].get("peak_reserved")
    tt = r["torch_true"].get("peak_reserved"); cp = r["pytorch"].get("peak_reserved")
    cs = r["cross"].get("peak_reserved")
    f = lambda x: "n/a" if x is None else f"{x / M:.0f}"
    a1 = tf is not None and co is not None and abs(tf - co) <= SEG
    a2 = tt is not None and cp is not None and abs(tt - cp) <= SEG
    ok += a1 and a2
    missing += any(x is None for x in (tf, co, tt, cp))
    off_bad += not a1
    key = (r["streams"], r["ops"])
    per_config[key] = per_config.get(key, 0) + (a1 and a2)
    print(f"| {r['streams']} | {r['ops']} | {r['seed']} | {f(tf)} | {f(co)} | {'yes' if a1 else 'NO'} "
          f"| {f(tt)} | {f(cp)} | {'yes' if a2 else 'NO'} | {f(cs)} |")
print(f"\n{ok}/{len(rows)} programs agree within one 2 MiB segment in both modes"
      + (f" (torch {rows[0]['torch_true'].get('torch')})" if rows and rows[0]['torch_true'] else ""))
min_agree = int(sys.argv[2])
fails = []
if not rows:
    fails.append("no program ran")
if missing:
    fails.append(f"{missing} program(s) without every figure (n/a)")
if off_bad:
    fails.append(f"{off_bad} program(s) where reuse off disagrees with PyTorch's False")
for (st, ops), n in sorted(per_config.items()):
    if n < min_agree:
        fails.append(f"streams={st} ops={ops}: {n} program(s) agree in both modes, fewer than {min_agree}")
for f in fails:
    print(f"FAIL: {f}")
print("AGREEMENT CRITERION MET" if not fails else "AGREEMENT CRITERION FAILED")
sys.exit(1 if fails else 0)
PYEOF
