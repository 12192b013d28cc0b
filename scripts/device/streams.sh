#!/usr/bin/env bash
# Many streams on the GPU (issue 39, item 4): one block on each of N
# streams, all live at once (traces/many_streams.py), replayed with
# `cachalot replay --backend cuda` in the default (cachalot's expandable
# mode), with fixed segments, and in PyTorch's expandable mode (1.125x the
# device reserved per stream: expected to run out of address space before
# 1,000 streams of an H200). From the repository root on the GPU machine:
#
#   scripts/device/streams.sh
#
# Reads the CLI from $CACHALOT_BIN (default carry/bin/cachalot if there: a
# release build made elsewhere, `cargo build --release -p cachalot-cli`,
# stripped with `strip --strip-debug`; else $DIST/bin/cachalot, DIST
# default dist/cuda, as `cargo xtask bench-cuda` packs it). STREAMS (default "128 1000") and SIZE
# (default 85983232, 82 MiB) choose the traces; CONFIGS the configurations
# ("default" is no --config); BACKEND (default cuda; mock tries the script
# on a machine without a GPU). Logs and the JSON lines in $OUT. Prints a
# table last: per trace and config, whether it replayed, the peak reserved
# and allocated bytes, and the device allocations; for a failure, the first
# line of the allocator's report.
#
# Success: "default" replays every trace (fits=yes, peak reserved = peak
# allocated = STREAMS x SIZE), as "expandable_segments:False" does.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BIN=${CACHALOT_BIN:-carry/bin/cachalot}
[ -n "${CACHALOT_BIN:-}" ] || [ -x "$BIN" ] || BIN=${DIST:-dist/cuda}/bin/cachalot
STREAMS=${STREAMS:-128 1000}
SIZE=${SIZE:-85983232}
CONFIGS=${CONFIGS:-default expandable_segments:False placement:pytorch,expandable_segments:True}
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null
[ -x "$BIN" ] || { echo "no CLI at $BIN"; exit 2; }
R=$OUT/streams.jsonl; : >"$R"
for n in $STREAMS; do
  T=$OUT/many_streams_$n.trace
  python3 traces/many_streams.py "$T" --streams "$n" --size "$SIZE" || exit 2
  for c in $CONFIGS; do
    args=(replay "$T" --backend "${BACKEND:-cuda}" --json --passes 1)
    [ "$c" = default ] || args+=(--config "$c")
    log=$OUT/replay_${n}_$(echo "$c" | tr ':,' '__').log
    S=$(date +%s.%N)
    "$BIN" "${args[@]}" >"$log.out" 2>"$log.err"
    rc=$?
    E=$(date +%s.%N)
    python3 - "$n" "$c" "$rc" "$log.out" "$log.err" "$S" "$E" >>"$R" <<'P'
import json, sys
n, c, rc, out, err, s, e = sys.argv[1:]
line = next((l for l in open(out) if l.startswith("{")), None)
j = json.loads(line) if line else {}
msg = open(err).read().strip().splitlines()
print(json.dumps({"streams": int(n), "config": c, "rc": int(rc), "fits": int(rc) == 0,
                  "peak_reserved": j.get("peak_reserved"), "peak_allocated": j.get("peak_allocated"),
                  "device_allocs": j.get("device_allocs_all"), "seconds": float(e) - float(s),
                  "error": msg[-1][:400] if msg and int(rc) != 0 else None}))
P
  done
done
python3 - "$R" "$SIZE" <<'P'
import json, sys
size = int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-8s %-46s %-5s %18s %18s %8s %7s" % ("streams", "config", "fits", "peak reserved", "peak allocated", "allocs", "s"))
ok = True
for r in rows:
    print("%-8d %-46s %-5s %18s %18s %8s %7.2f" % (r["streams"], r["config"], "yes" if r["fits"] else "NO",
          r["peak_reserved"], r["peak_allocated"], r["device_allocs"], r["seconds"]))
    if r["error"]:
        print("         ", r["error"][:300])
    if r["config"] == "default":
        good = r["fits"] and r["peak_allocated"] == r["streams"] * size
        ok = ok and good
print("default replays every trace:", "yes" if ok else "NO")
P
