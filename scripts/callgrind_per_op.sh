#!/usr/bin/env bash
# Marginal host instructions per operation of `cachalot replay` on the mock backend,
# counted by callgrind (deterministic, unlike ns/op on a shared machine).
#
# Usage (from the repo root):
#   scripts/callgrind_per_op.sh BIN [trace...]
#   scripts/callgrind_per_op.sh --bin BIN [trace...]
# BIN is a cachalot CLI binary (e.g. target/release/cachalot). Traces are trace files or
# synthetic names; default: traces/gpt2_train.trace traces/resnet50_train.trace
# traces/side_stream_pipeline.trace hit_1mib churn_1stream churn_4streams.
#
# For each trace it runs, under valgrind --tool=callgrind,
#   BIN replay --backend mock --passes 4 TRACE      -> Ir(4)
#   BIN replay --backend mock --passes 2 TRACE      -> Ir(2)
# and prints Ir/op = (Ir(4) - Ir(2)) / (2 * ops): the instructions of two more passes
# over the trace, per operation, so start-up, parsing and the cold first pass cancel
# out. ops is the trace's op count from `BIN replay --backend mock --json --passes 1`.
# Runs use `env -i PATH=/usr/bin:/bin` from the repo root, with the same argv apart from
# the pass count, so the environment cannot perturb the counts.
# Each trace costs two callgrind runs (seconds to a minute each on the synthetic traces).
# CONFIG=... (e.g. CONFIG=expandable_segments:True) replays under that allocator
# configuration (`--config`); unset, the default.
set -euo pipefail

if [[ ${1:-} == --bin ]]; then shift; fi
if [[ $# -lt 1 || ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BIN=$(realpath "$1"); shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
if [[ $# -eq 0 ]]; then
  set -- traces/gpt2_train.trace traces/resnet50_train.trace traces/side_stream_pipeline.trace \
         hit_1mib churn_1stream churn_4streams
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
RUN=(env -i PATH=/usr/bin:/bin)
CFG=()
if [[ -n ${CONFIG:-} ]]; then CFG=(--config "$CONFIG"); fi

# Total Ir of one callgrind run of `BIN replay --backend mock --passes $2 $1`.
ir() {
  local out="$TMP/cg.$2.out"
  "${RUN[@]}" valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$BIN" replay --backend mock "${CFG[@]}" --passes "$2" "$1" >/dev/null 2>"$TMP/cg.log" \
    || { cat "$TMP/cg.log" >&2; exit 1; }
  # "summary: N" (older valgrind) or "totals: N" (the first event is Ir)
  awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

printf '%-24s %10s %14s %14s %10s\n' trace ops "Ir(passes=2)" "Ir(passes=4)" Ir/op
for t in "$@"; do
  ops=$("${RUN[@]}" "$BIN" replay --backend mock "${CFG[@]}" --json --passes 1 "$t" \
        | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["ops"])')
  ir2=$(ir "$t" 2)
  ir4=$(ir "$t" 4)
  perop=$(python3 -c "print(f'{($ir4 - $ir2) / (2 * $ops):.1f}')")
  printf '%-24s %10s %14s %14s %10s\n' "$(basename "$t" .trace)" "$ops" "$ir2" "$ir4" "$perop"
done
