#!/usr/bin/env bash
# Session 18 (cheaper page moves in cachalot's expandable mode; the host's
# CPU topology under issue 18's thread goal), from the repository root on
# the GPU machine, after `cargo xtask test-cuda && cargo xtask bench-cuda`
# packed dist/cuda here and main before the session (`fba08a3`) was copied
# to dist/exp/s17/ (its CUDA `cachalot` CLI and its `mlp-train`, each
# `cargo build --release`, stripped). Two calls:
#   PART=1  the CUDA test binaries (dist/cuda/run.sh), then
#           scripts/device/session17_order.sh with OLD=s17 (ROUNDS=4): new
#           and s17, default and cachalot's expandable mode, the order
#           rotating, PyTorch's default mode each round;
#   PART=2  the CPU topology (lscpu), the threads benchmark (cachalot and
#           PyTorch's C++ harness, ROUNDS rounds), then 1 and 8 threads
#           pinned to one logical CPU per physical core (taskset: the same
#           cores for both allocators), then the cudarc workload, new and
#           s17 (scripts/device/fences_ab.sh with AB=0).
# Logs in $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
S=$(date +%s)
if [ "${PART:-1}" = 1 ]; then
  (cd dist/cuda && CACHALOT_SANITIZER=0 timeout 170 ./run.sh) >"$OUT/cuda-tests.txt" 2>&1
  echo "tests: $(tail -n 2 "$OUT/cuda-tests.txt" | tr '\n' ' ') after $(( $(date +%s) - S )) s"
  OUT=$OUT/order OLD=s17=dist/exp/s17/cachalot ROUNDS=${ROUNDS:-4} timeout 330 \
    scripts/device/session17_order.sh >"$OUT/order.txt" 2>&1
  echo "order: rc=$? after $(( $(date +%s) - S )) s"
  cat "$OUT/order.txt"
  exit 0
fi
lscpu >"$OUT/lscpu.txt" 2>&1
lscpu -p=CPU,CORE,SOCKET,NODE >"$OUT/lscpu-p.txt" 2>&1
grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|CPU max MHz)" "$OUT/lscpu.txt"
# one logical CPU per physical core, in core order
ONE=$(grep -v '^#' "$OUT/lscpu-p.txt" | awk -F, '!seen[$4","$3","$2]++ {print $1}' | paste -sd, -)
echo "one CPU per core: $ONE"
(cd dist/cuda && pytorch/build.sh build >/dev/null 2>&1) || echo "torch harness build failed"
L=$OUT/threads.txt; : >"$L"
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "== new r$r" >>"$L"; timeout 60 dist/cuda/bin/cachalot threads --backend cuda >>"$L" 2>&1
  echo "== torch r$r" >>"$L"; timeout 60 dist/cuda/build/torch_threads --mode=default >>"$L" 2>&1
done
echo "threads: after $(( $(date +%s) - S )) s"
P=$OUT/pinned.txt; : >"$P"
if [ -n "$ONE" ]; then
  for r in $(seq 1 "${ROUNDS:-3}"); do
    echo "== new-pinned r$r" >>"$P"
    timeout 60 taskset -c "$ONE" dist/cuda/bin/cachalot threads --backend cuda --threads 1,8 >>"$P" 2>&1
    echo "== torch-pinned r$r" >>"$P"
    timeout 60 taskset -c "$ONE" dist/cuda/build/torch_threads --mode=default --threads=1,8 >>"$P" 2>&1
  done
fi
echo "pinned: after $(( $(date +%s) - S )) s"
OUT=$OUT/cudarc AB=0 RUNS=${RUNS:-2} OLD_MLP=dist/exp/s17/mlp-train timeout 200 \
  scripts/device/fences_ab.sh >"$OUT/cudarc.txt" 2>&1
echo "cudarc: rc=$? after $(( $(date +%s) - S )) s"
sed -n '/== mlp-train/,$p' "$OUT/cudarc.txt"
python3 - "$L" "$P" <<'PY'
import json, sys, statistics as st, collections
for path in sys.argv[1:]:
    rows = collections.defaultdict(lambda: collections.defaultdict(list)); cur = None
    for line in open(path):
        if line.startswith("=="): cur = line.split()[1]; continue
        if line.startswith("{"):
            j = json.loads(line); rows[cur][j["threads"]].append(j.get("mops_per_s", j.get("mops")))
    print(path.rsplit("/", 1)[-1], "Mops/s, median (min-max) over rounds")
    for v, d in rows.items():
        print("  %-14s" % v + "  ".join("%d: %.2f (%.2f-%.2f)" % (t, st.median(x), min(x), max(x)) for t, x in sorted(d.items())))
        if 1 in d and 8 in d:
            print("  %-14s 8 threads / 1 thread: %.2fx" % (v, st.median(d[8]) / st.median(d[1])))
PY
