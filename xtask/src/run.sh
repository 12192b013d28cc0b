#!/usr/bin/env bash
# Runs every packed test binary (made by `cargo xtask test-cuda`,
# `test-hip` or `test-level-zero` on a machine without the hardware) and
# prints one summary table. No Rust is needed here.
#
#   ./run.sh [libtest args...]     e.g. ./run.sh --test-threads=1
#
# 1. The normal run: each binary once, with CACHALOT_REQUIRE_GPU=1, so a
#    test that would print "skipped: <reason>" (no device, no driver, no
#    capture API, no C compiler...) fails instead.
# 2. The sanitizer run, when compute-sanitizer is on PATH or in
#    /usr/local/cuda/bin: each binary again under
#    `compute-sanitizer --tool memcheck --leak-check full`. Any invalid
#    access, leak or other sanitizer error fails the binary; a driver API
#    error ("Program hit CUDA_ERROR_... on CUDA API call to cu...") fails it
#    unless sanitizer-allow.txt (next to this script) lists it as provoked
#    on purpose by that binary's tests.
#
# Fails (exit 1) when a binary fails in either run, when any skip notice
# appears while CACHALOT_REQUIRE_GPU=1, or when no test passed at all.
#
# env: CACHALOT_REQUIRE_GPU=0        let skips pass (a machine without the device)
#      CACHALOT_SANITIZER=0          no sanitizer run
#      CACHALOT_REQUIRE_SANITIZER=1  fail when compute-sanitizer is not found
#      CACHALOT_SANITIZER_ALLOW=FILE another allow-list
#      CACHALOT_SANITIZER_TIMEOUT=S  per binary under the sanitizer (default 1800)
#      CACHALOT_TRACES               the trace folder (default ./traces)
#      CACHALOT_REPO_ROOT            the files the tests read from the repository
#                                    (default ./repo: fuzz inputs, proptest's saved cases)
#
# Logs go to logs/<binary>.log (normal run), logs/<binary>.sanitizer.log
# (test output under the sanitizer) and logs/<binary>.memcheck.txt (the
# sanitizer's report).
set -u
cd "$(dirname "$0")" || exit 2
export CACHALOT_TRACES="${CACHALOT_TRACES:-$PWD/traces}"
export CACHALOT_REPO_ROOT="${CACHALOT_REPO_ROOT:-$PWD/repo}"
if [ ! -d "$CACHALOT_REPO_ROOT/fuzz" ]; then
  echo "run.sh: $CACHALOT_REPO_ROOT has no fuzz/: pack again with cargo xtask test-cuda"
  exit 2
fi
export CACHALOT_REQUIRE_GPU="${CACHALOT_REQUIRE_GPU:-1}"
require_gpu=0
case $CACHALOT_REQUIRE_GPU in '' | 0) ;; *) require_gpu=1 ;; esac
mkdir -p logs
shopt -s nullglob
bins=(tests/*)
if [ ${#bins[@]} -eq 0 ]; then
  echo "run.sh: no test binaries under tests/"
  exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L

# libtest counts of a log: "passed failed ignored"
counts() {
  awk '/^test result:/ {
      for (k = 1; k < NF; k++) {
        if ($(k+1) ~ /^passed/) p += $k; if ($(k+1) ~ /^failed/) f += $k; if ($(k+1) ~ /^ignored/) i += $k
      } } END { printf "%d %d %d\n", p, f, i }' "$1"
}

now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

# ---- 1. the normal run ----
declare -A n_pass n_fail n_ign n_skip n_time n_status
total_pass=0 total_fail=0 total_skip=0 bad=0
for t in "${bins[@]}"; do
  name=$(basename "$t")
  log="logs/$name.log"
  start=$(now)
  "$t" --nocapture "$@" >"$log" 2>&1
  rc=$?
  secs=$(elapsed "$start")
  read -r p f i < <(counts "$log")
  s=$(grep -c '^skipped:' "$log")
  status=ok
  if [ "$rc" -ne 0 ]; then
    status="FAILED(rc=$rc)"
    [ "$f" -eq 0 ] && f=1
    echo "---- $name failed; end of its log:"
    grep -E '^test .* FAILED$|panicked at' "$log" | head -20
    tail -n 30 "$log"
  elif [ "$require_gpu" -eq 1 ] && [ "$s" -gt 0 ]; then
    status="SKIPPED($s)"
    echo "---- $name printed $s skip notice(s) while CACHALOT_REQUIRE_GPU=$CACHALOT_REQUIRE_GPU:"
    grep '^skipped:' "$log" | head -20
  fi
  [ "$status" = ok ] || bad=$((bad + 1))
  n_pass[$name]=$p n_fail[$name]=$f n_ign[$name]=$i n_skip[$name]=$s n_time[$name]=$secs n_status[$name]=$status
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f)); total_skip=$((total_skip + s))
done

# ---- 2. the sanitizer run ----
san=""
if [ "${CACHALOT_SANITIZER:-1}" != 0 ]; then
  if command -v compute-sanitizer >/dev/null; then
    san=$(command -v compute-sanitizer)
  elif [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    san=/usr/local/cuda/bin/compute-sanitizer
  fi
fi
allow_file=${CACHALOT_SANITIZER_ALLOW:-$PWD/sanitizer-allow.txt}
# allow-list rules: "binary-glob error-glob api-glob" (comments after #)
allow_rules=()
if [ -n "$san" ] && [ -f "$allow_file" ]; then
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    read -r -a w <<<"$line"
    [ ${#w[@]} -eq 0 ] && continue
    if [ ${#w[@]} -ne 3 ]; then
      echo "run.sh: $allow_file: bad rule (want: binary error api): $line"
      exit 2
    fi
    allow_rules+=("${w[0]} ${w[1]} ${w[2]}")
  done <"$allow_file"
fi
declare -A rule_used s_time s_errors s_allowed s_status
san_bad=0
if [ -n "$san" ]; then
  echo
  echo "run.sh: sanitizer run: $san --tool memcheck --leak-check full ($("$san" --version 2>/dev/null | grep -m1 -i version))"
  san_args=(--tool memcheck --leak-check full --print-limit 10000)
  "$san" --help 2>&1 | grep -q -- '--require-cuda-init' && san_args+=(--require-cuda-init no)
  tmo=()
  command -v timeout >/dev/null && tmo=(timeout --kill-after=30 "${CACHALOT_SANITIZER_TIMEOUT:-1800}")
  for t in "${bins[@]}"; do
    name=$(basename "$t")
    log="logs/$name.sanitizer.log"
    report="logs/$name.memcheck.txt"
    rm -f "$report"
    start=$(now)
    CACHALOT_UNDER_SANITIZER=1 ${tmo[@]+"${tmo[@]}"} "$san" "${san_args[@]}" --log-file "$report" "$t" --nocapture "$@" >"$log" 2>&1
    rc=$?
    s_time[$name]=$(elapsed "$start")
    # one line per finding: "API <error> <call>", "REAL <text>", "SUMMARY <n>", "NOCUDA"
    findings=$(awk '
      # With stripped binaries the sanitizer sometimes prints a host symbol
      # where the error name and the call belong: the error is then named
      # from its number, and the call is "unknown-call".
      BEGIN {
        names[1] = "CUDA_ERROR_INVALID_VALUE"; names[2] = "CUDA_ERROR_OUT_OF_MEMORY"
        names[101] = "CUDA_ERROR_INVALID_DEVICE"; names[401] = "CUDA_ERROR_ILLEGAL_STATE"
        names[900] = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        names[901] = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
      }
      /^========= Program hit / {
        err = $4; call = $NF; sub(/\.$/, "", call)
        code = ""
        if (match($0, /\(error [0-9]+\)/)) code = substr($0, RSTART + 7, RLENGTH - 8)
        if (err !~ /^CUDA_ERROR_/) err = (code in names) ? names[code] : "error-" code
        if (call !~ /^cu[A-Za-z0-9_]+$/) call = "unknown-call"
        print "API " err " " call; next }
      /^========= ERROR SUMMARY:/ { print "SUMMARY " $4; next }
      # a binary that never calls CUDA gets this line and no summary
      /^========= Target application terminated before first instrumented API call/ { print "NOCUDA"; next }
      # informational: the banner, the leak summary, a nonzero exit (the
      # test result says it)
      /^========= (COMPUTE-SANITIZER|LEAK SUMMARY:|Target application returned an error)/ { next }
      /^=========  / { next }
      /^========= ./ { sub(/^========= /, ""); print "REAL " $0 }
    ' "$report" 2>/dev/null)
    errors=0 allowed=0 real=0 summary=-1 nocuda=0
    real_lines=() api_lines=()
    while IFS= read -r fl; do
      [ -z "$fl" ] && continue
      read -r kind a b _ <<<"$fl"
      case $kind in
        SUMMARY) summary=$a ;;
        NOCUDA) nocuda=1 ;;
        REAL) real=$((real + 1)); real_lines+=("${fl#REAL }") ;;
        API)
          errors=$((errors + 1))
          ok=0
          for r in ${allow_rules[@]+"${allow_rules[@]}"}; do
            read -r rb re ra <<<"$r"
            # shellcheck disable=SC2053 # the rules are globs
            if [[ $name == $rb && $a == $re && $b == $ra ]]; then
              ok=1
              rule_used[$r]=1
              break
            fi
          done
          if [ "$ok" -eq 1 ]; then allowed=$((allowed + 1)); else api_lines+=("$a on $b"); fi
          ;;
      esac
    done <<<"$findings"
    errors=$((errors + real))
    # errors the sanitizer counted but did not print (over --print-limit)
    hidden=0
    if [ "$summary" -gt "$errors" ]; then
      hidden=$((summary - errors))
      real=$((real + hidden))
      errors=$summary
    fi
    status=ok
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      status="TIMEOUT"
    elif [ ! -s "$report" ]; then
      status="NO REPORT(rc=$rc)"
    elif [ "$real" -gt 0 ] || [ ${#api_lines[@]} -gt 0 ]; then
      status="ERRORS($((real + ${#api_lines[@]})))"
    elif [ "$rc" -ne 0 ]; then
      status="FAILED(rc=$rc)"
    elif [ "$summary" -lt 0 ] && [ "$nocuda" -eq 1 ]; then
      status="ok (no CUDA)"
    elif [ "$summary" -lt 0 ]; then
      status="NO SUMMARY"
    fi
    if [ "${status%% *}" != ok ]; then
      san_bad=$((san_bad + 1))
      echo "---- $name under the sanitizer: $status"
      for l in ${real_lines[@]+"${real_lines[@]}"}; do echo "sanitizer: $l"; done | sort | uniq -c | head -20
      for l in ${api_lines[@]+"${api_lines[@]}"}; do echo "API error not in the allow-list: $l"; done | sort | uniq -c | head -20
      [ "$hidden" -gt 0 ] && echo "  $hidden more errors counted but not printed (over --print-limit)"
      grep -E '^test .* FAILED$|panicked at' "$log" | head -10
      [ "$rc" -ne 0 ] && tail -n 15 "$log"
    fi
    s_errors[$name]=$errors s_allowed[$name]=$allowed s_status[$name]=$status
  done
  for r in ${allow_rules[@]+"${allow_rules[@]}"}; do
    [ -n "${rule_used[$r]:-}" ] || echo "run.sh: note: allow-list rule matched nothing: $r"
  done
elif [ "${CACHALOT_SANITIZER:-1}" != 0 ]; then
  echo
  echo "run.sh: compute-sanitizer not found (PATH, /usr/local/cuda/bin): no memcheck run"
  if [ "${CACHALOT_REQUIRE_SANITIZER:-0}" != 0 ]; then
    san_bad=1
    echo "run.sh: CACHALOT_REQUIRE_SANITIZER is set: that is a failure"
  fi
fi

# ---- one summary table ----
echo
printf '%-44s %7s %7s %8s %8s %8s  %-14s | %8s %7s %7s  %s\n' \
  binary passed failed ignored skipped time status memcheck errors allowed status
for t in "${bins[@]}"; do
  name=$(basename "$t")
  if [ -n "$san" ]; then
    tail_cols=$(printf '%7ss %7d %7d  %s' "${s_time[$name]}" "${s_errors[$name]}" "${s_allowed[$name]}" "${s_status[$name]}")
  else
    tail_cols=$(printf '%8s %7s %7s  %s' - - - -)
  fi
  printf '%-44s %7d %7d %8d %8d %7ss  %-14s | %s\n' "$name" "${n_pass[$name]}" "${n_fail[$name]}" \
    "${n_ign[$name]}" "${n_skip[$name]}" "${n_time[$name]}" "${n_status[$name]}" "$tail_cols"
done
echo
echo "$total_pass passed, $total_fail failed ($total_skip skip notices)$([ -n "$san" ] && echo "; memcheck: $san_bad binaries with findings or failures")"
fail=0
[ "$bad" -eq 0 ] || fail=1
[ "$san_bad" -eq 0 ] || fail=1
if [ "$total_pass" -eq 0 ]; then
  echo "run.sh: no test passed"
  fail=1
fi
if [ "$require_gpu" -eq 1 ] && [ "$total_skip" -gt 0 ]; then
  echo "run.sh: $total_skip skip notice(s) with CACHALOT_REQUIRE_GPU=$CACHALOT_REQUIRE_GPU"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "run.sh: ALL OK"
exit "$fail"
