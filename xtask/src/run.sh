#!/usr/bin/env bash
# Runs every packed CUDA test binary (made by `cargo xtask test-cuda` on a
# machine without a GPU) and prints a summary table. No Rust is needed here.
#
#   ./run.sh [libtest args...]     e.g. ./run.sh --test-threads=1
#
# Logs go to logs/<binary>.log. Exit status: 0 when every binary passed.
# Tests find the packed traces through CACHALOT_TRACES.
set -u
cd "$(dirname "$0")" || exit 2
export CACHALOT_TRACES="${CACHALOT_TRACES:-$PWD/traces}"
mkdir -p logs
total_pass=0 total_fail=0 total_skip=0 bad=0
rows=()
shopt -s nullglob
bins=(tests/*)
if [ ${#bins[@]} -eq 0 ]; then
  echo "run.sh: no test binaries under tests/"
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
for t in "${bins[@]}"; do
  name=$(basename "$t")
  log="logs/$name.log"
  start=$(date +%s.%N)
  "$t" --nocapture "$@" >"$log" 2>&1
  rc=$?
  secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
  read -r p f i < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^ignored/) i += $k
      } } END { printf "%d %d %d\n", p, f, i }' "$log")
  s=$(grep -c '^skipped:' "$log")
  status=ok
  if [ "$rc" -ne 0 ]; then
    status="FAILED(rc=$rc)"
    bad=$((bad + 1))
    [ "$f" -eq 0 ] && f=1
    echo "---- $name failed; end of its log:"
    grep -E '^test .* FAILED$|panicked at' "$log" | head -20
    tail -n 30 "$log"
  fi
  rows+=("$(printf '%-44s %7d %7d %8d %8d %7ss  %s' "$name" "$p" "$f" "$i" "$s" "$secs" "$status")")
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
done
echo
printf '%-44s %7s %7s %8s %8s %8s  %s\n' binary passed failed ignored skipped time status
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "$total_pass passed, $total_fail failed ($total_skip skip notices)"
[ "$bad" -eq 0 ]
