#!/usr/bin/env bash
# The threads benchmark on the GPU machine: T threads, each allocating and
# freeing on its own stream (`cachalot threads`), against PyTorch's C++
# CUDACachingAllocator on the same operations (bench/pytorch/torch_threads.cpp),
# alternated in rounds in one call. From the repository root, after `cargo
# xtask bench-cuda` packed dist/cuda here.
#
#   scripts/device/threads.sh
#   WAYS="new= old=@dist/exp/old/cachalot" ROUNDS=4 scripts/device/threads.sh
#
# env: WAYS          cachalot's ways, NAME=CONFIG[@CLI] as in replay.sh
#                    (default: "default= stats-thread= monotonic=
#                    fixed=expandable_segments:False": the default, the
#                    default with the flushed stat logs summed by the stats
#                    thread instead of the allocating threads, the default
#                    with the stat logs' stamps from the monotonic clock
#                    instead of the fenced TSC, and fixed segments)
#      ARGS_<NAME>   more arguments of that way's `cachalot threads` (NAME
#                    with '-' written '_'; defaults: "--stats-thread on" for
#                    the way "stats-thread", "--clock monotonic" for
#                    "monotonic")
#      PEAKS=0       leaves the peak check out: the packed tests
#                    cachalot-clock-lib (stamps exchanged between threads
#                    never go back, on this host's cores) and
#                    cachalot-conformance-shards' peaks_match_a_serial_replay
#                    (8 and 16 threads against a serial replay of the same
#                    operations), from $TESTS_DIR (default $DIST/tests,
#                    `cargo xtask test-cuda` packs them)
#      THREADS_LIST  thread counts (default 1,2,4,8,16)
#      OPS           operations per thread (default: the command's, 200,000)
#      ROUNDS        rounds (default 3)
#      TORCH=0       leaves PyTorch's harness out
#      DIST, OUT     as in replay.sh; the log is $OUT/threads.txt
# Prints last the median (min-max) Mops/s per way and thread count, each
# way's throughput over its own one thread and over PyTorch's; then for
# the first way, 8 threads over one (issue 39 asks at least 5.00), 16
# threads against 8 (not below), one thread against the way "monotonic"
# (no regression: about 1), and the peak check ("peak check: passed").
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=$OUT/threads.txt; : >"$L"
D=${DIST:-dist/cuda}
WAYS=${WAYS:-default= stats-thread= monotonic= fixed=expandable_segments:False}
ARGS_monotonic=${ARGS_monotonic---clock monotonic}
ARGS_stats_thread=${ARGS_stats_thread---stats-thread on}
T=${THREADS_LIST:-1,2,4,8,16}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "cores: $(nproc), clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
if [ "${TORCH:-1}" = 1 ]; then
  (cd "$D" && pytorch/build.sh build >"$OUT/torch-build.txt" 2>&1) || echo "threads.sh: the PyTorch harness failed to build"
fi
for r in $(seq 1 "${ROUNDS:-3}"); do
  for spec in $WAYS; do
    name=${spec%%=*} rest=${spec#*=} cli=$D/bin/cachalot
    case $rest in *@*) cli=${rest#*@}; rest=${rest%%@*} ;; esac
    envv=ENV_${name//-/_} argv=ARGS_${name//-/_}
    echo "== $name r$r" >>"$L"
    env ${!envv:-} timeout 300 "$cli" threads --backend "${BACKEND:-cuda}" --threads "$T" ${OPS:+--ops $OPS} \
      ${rest:+--config "$rest"} ${!argv:-} >>"$L" 2>&1
  done
  if [ "${TORCH:-1}" = 1 ]; then
    echo "== torch r$r" >>"$L"; timeout 300 "$D/build/torch_threads" --mode=default >>"$L" 2>&1
  fi
done
PEAK=skipped
if [ "${PEAKS:-1}" = 1 ]; then
  TD=${TESTS_DIR:-$D/tests}
  if [ -x "$TD/cachalot-clock-lib" ] && [ -x "$TD/cachalot-conformance-shards" ]; then
    PEAK=failed
    "$TD/cachalot-clock-lib" >"$OUT/clock-tests.txt" 2>&1 \
      && "$TD/cachalot-conformance-shards" --exact peaks_match_a_serial_replay --nocapture \
        >"$OUT/peak-test.txt" 2>&1 \
      && PEAK=passed
    grep -E "test result" "$OUT/clock-tests.txt"; grep -E "threads, logs|test result" "$OUT/peak-test.txt"
  else
    PEAK="missing (no $TD/cachalot-clock-lib or $TD/cachalot-conformance-shards)"
  fi
fi
python3 - "$L" "$PEAK" $WAYS <<'P' | tee "$OUT/threads-table.txt"
import json, sys, statistics as st, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list)); cur = None
for line in open(sys.argv[1]):
    if line.startswith("=="): cur = line.split()[1]; continue
    if line.startswith("{"):
        j = json.loads(line); rows[cur][j["threads"]].append(j.get("mops_per_s", j.get("mops")))
ts = sorted({t for v in rows.values() for t in v})
print("Mops/s, median (min-max) over rounds")
print("%-12s" % "way" + "".join("%20s" % t for t in ts))
names = [w.split("=")[0] for w in sys.argv[3:]]
for v in ["torch"] + names:
    if not rows[v]: continue
    print("%-12s" % v + "".join("%20s" % ("%.2f (%.2f-%.2f)" % (st.median(rows[v][t]), min(rows[v][t]), max(rows[v][t])) if rows[v][t] else "-") for t in ts))
for v in names:
    if not rows[v][1]: continue
    one = st.median(rows[v][1])
    line = "%-12s x its 1 thread: " % v + " ".join("%d:%.2f" % (t, st.median(rows[v][t]) / one) for t in ts if rows[v][t])
    if rows["torch"]:
        line += " | x PyTorch: " + " ".join("%d:%.1f" % (t, st.median(rows[v][t]) / st.median(rows["torch"][t])) for t in ts if rows[v][t] and rows["torch"][t])
    print(line)
med = lambda v, t: st.median(rows[v][t]) if rows[v][t] else None
first = names[0] if names else None
if first and med(first, 1):
    one = med(first, 1)
    if med(first, 8):
        r8 = med(first, 8) / one
        print("%s: 8 threads / 1 thread: %.2f (at least 5.00: %s)" % (first, r8, "yes" if r8 >= 5 else "NO"))
    if med(first, 8) and med(first, 16):
        print("%s: 16 threads %.2f, 8 threads %.2f (not below: %s)" % (first, med(first, 16), med(first, 8), "yes" if med(first, 16) >= med(first, 8) else "NO"))
    if "monotonic" in names and med("monotonic", 1):
        print("%s: 1 thread / monotonic's: %.3f" % (first, one / med("monotonic", 1)))
    if "stats-thread" in names:
        for t in (8, 16):
            if med("stats-thread", t) and med(first, t):
                print("stats-thread: %d threads %.2f against %s's %.2f (%.2fx; over %s's one thread: %.2f)" % (
                    t, med("stats-thread", t), first, med(first, t), med("stats-thread", t) / med(first, t),
                    first, med("stats-thread", t) / one))
print("peak check:", sys.argv[2])
P
