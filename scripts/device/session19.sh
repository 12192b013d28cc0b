#!/usr/bin/env bash
# Session 19, one call on the GPU machine, from the repository root, after
# `cargo xtask bench-cuda` packed dist/cuda and the experimental builds of
# bench/experiments/threads-ablation-*.patch (README.md there) were copied
# to dist/exp/{local,noclock,nolog}/ and main's to dist/exp/base/:
#   1. the threads benchmark's ablation (issue 18): main before the
#      session (`base`, 48318b2); the session's flush by time cut, two
#      versions of bench/experiments/threads-timecut-flush.patch, measured
#      and not kept (`home`, dist/exp/home/: the entries copied out of the
#      logs under the shard's lock; `home2`: the logs swapped for the
#      shard's own spares, the entries after the cut moved over); and
#      builds of `base` that leave out, in turn, the flush and summing of
#      the stat logs (`local`), also the clock read (`noclock`), and every
#      log entry (`nolog`). THREADS_LIST (1,2,8,16) threads, ROUNDS rounds,
#      through scripts/device/threads_ceiling.sh;
#   2. ORDER_ROUNDS (2) rounds of scripts/device/session17_order.sh with
#      OLD=base: `new` (dist/cuda/bin/cachalot: the `home2` build copied
#      there) and `base` in the default configuration and cachalot's
#      expandable mode against PyTorch's default mode on every trace
#      (issue 18's median and hit_1mib goals).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\) per core"
cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null
B=""
for v in base home home2 local noclock nolog; do [ -x dist/exp/$v/cachalot ] && B="$B $v=dist/exp/$v/cachalot"; done
BUILDS="${B# }" THREADS_LIST=${THREADS_LIST:-1,2,8,16} ROUNDS=${ROUNDS:-3} \
  timeout 250 scripts/device/threads_ceiling.sh > "$OUT/ablation.txt" 2>&1
OLD=base=dist/exp/base/cachalot ROUNDS=${ORDER_ROUNDS:-2} \
  timeout 220 scripts/device/session17_order.sh > "$OUT/order.txt" 2>&1
tail -30 "$OUT/order.txt"
tail -12 "$OUT/ablation.txt"
# Run 2 of the session: `cp dist/exp/base/cachalot dist/cuda/bin/cachalot`
# here, then there `OLD=base=dist/exp/base/cachalot ROUNDS=4
# scripts/device/session17_order.sh` (two copies of main: the host's spread).
# Run 3: `dist/exp/clock/clock_scaling 1,2,4,8,16` three times (the clock
# read's cost by thread count; `cargo build --release -p cachalot-core
# --example clock_scaling`).
