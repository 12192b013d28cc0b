#!/usr/bin/env bash
# Mutation run over the engine: applies each deliberate mutant of
# scripts/mutants.txt alone to a scratch copy of the working tree and runs a
# fast part of the suite; every mutant must be caught (a test fails, the
# build breaks, or the run times out). Prints a table and the score.
#
#   scripts/mutants.sh [--list FILE] [--only ID[,ID...]] [--timeout SECS] [--ids]
#
#   --list FILE   mutant list (default scripts/mutants.txt; format in its header)
#   --only IDS    run only these mutants (comma-separated ids)
#   --timeout S   per mutant, for the build and for the tests (default 900)
#   --ids         check the list against the tree, print the ids and stop
#
# env: MUTANTS_DIR       scratch folder (default target/mutants): the copy
#                        of the tree is MUTANTS_DIR/src, logs MUTANTS_DIR/logs
#      CARGO_TARGET_DIR  shared by every mutant (default MUTANTS_DIR/target),
#                        so only the mutated crate and its dependents rebuild
#      MUTANTS_PACKAGES  the packages tested (default
#                        "-p cachalot-core -p cachalot-conformance")
#      MUTANTS_TARGETS   their test targets (default "--tests"; e.g.
#                        "--test spec_tables" to see what one file catches)
#
# The working tree itself is never modified. Exit status: 0 when every
# mutant is caught or an accepted survivor, 1 when one survives
# unaccepted, 2 on a usage error, a mutant whose text is not found exactly
# once, or a baseline (unmutated) run that fails.
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
list=$root/scripts/mutants.txt
only=""
timeout_s=900
ids_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --list) list=${2:?--list needs a file}; shift 2 ;;
    --only) only=${2:?--only needs ids}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --ids) ids_only=1; shift ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "mutants.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $list in /*) ;; *) list=$PWD/$list ;; esac
command -v python3 >/dev/null || { echo "mutants.sh: python3 is needed" >&2; exit 2; }
command -v timeout >/dev/null || { echo "mutants.sh: timeout (coreutils) is needed" >&2; exit 2; }

work=${MUTANTS_DIR:-$root/target/mutants}
src=$work/src
logs=$work/logs
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$work/target}
export CARGO_TERM_COLOR=never
read -r -a pkgs <<<"${MUTANTS_PACKAGES:--p cachalot-core -p cachalot-conformance}"
read -r -a targets <<<"${MUTANTS_TARGETS:---tests}"

helper=$(mktemp)
trap 'rm -f "$helper"' EXIT
cat >"$helper" <<'PY'
"""Parses the mutant list. `check LIST ROOT` validates it against ROOT and
prints one tab-separated line per mutant (id, files, line, accepted,
what); `apply LIST ID DIR` applies mutant ID to the copy of the tree in
DIR; `files LIST ID` prints the files it changes, one a line; `accept
LIST ID` its reason to survive."""
import os
import re
import sys

KEYS = ("file", "from", "to", "what", "accept")


def die(msg):
    sys.stderr.write(f"mutants.sh: {msg}\n")
    sys.exit(2)


def unescape(v, where):
    def sub(m):
        c = m.group(1)
        if c == "n":
            return "\n"
        if c == "\\":
            return "\\"
        die(f"{where}: unknown escape \\{c}")
    return re.sub(r"\\(.)", sub, v)


def parse(path):
    """Mutants: id, at, what, accept and edits [{file, from, to}]: each
    `from` edits the last `file` named and needs its `to` next."""
    muts, cur = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not s.strip() or s.lstrip().startswith("#"):
                continue
            m = re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]\s*", s)
            if m:
                cur = {"id": m.group(1), "at": f"{path}:{n}", "edits": [], "file": None}
                muts.append(cur)
                continue
            if cur is None or "=" not in s:
                die(f"{path}:{n}: expected `[id]` or `key = value`")
            k, v = (x.strip() for x in s.split("=", 1))
            where = f"{path}:{n}"
            edits = cur["edits"]
            if k not in KEYS:
                die(f"{where}: unknown key {k!r}")
            if k == "file":
                cur["file"] = v
            elif k == "from":
                if cur["file"] is None:
                    die(f"{where}: `from` before any `file`")
                if edits and "to" not in edits[-1]:
                    die(f"{where}: `from` without the `to` of the one before")
                edits.append({"file": cur["file"], "from": unescape(v, where)})
            elif k == "to":
                if not edits or "to" in edits[-1]:
                    die(f"{where}: `to` without its `from`")
                edits[-1]["to"] = unescape(v, where)
            elif k in cur:
                die(f"{where}: {k} given twice")
            else:
                cur[k] = v
    seen = set()
    for m in muts:
        if not m["edits"] or "to" not in m["edits"][-1]:
            die(f"{m['at']}: mutant {m['id']} needs `file`, `from` and `to`")
        if "what" not in m:
            die(f"{m['at']}: mutant {m['id']} has no `what`")
        if any(e["from"] == e["to"] for e in m["edits"]):
            die(f"{m['at']}: mutant {m['id']} changes nothing")
        if m["id"] in seen:
            die(f"{m['at']}: mutant id {m['id']} given twice")
        seen.add(m["id"])
    return muts


def locate(m, e, tree):
    path = os.path.join(tree, e["file"])
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as err:
        die(f"{m['at']}: mutant {m['id']}: {err}")
    n = text.count(e["from"])
    if n != 1:
        die(f"{m['at']}: mutant {m['id']}: its `from` text occurs {n} times in {e['file']} (must be once)")
    return path, text


def find(muts, want):
    return next((m for m in muts if m["id"] == want), None) or die(f"no mutant {want}")


def main():
    cmd, lst = sys.argv[1], sys.argv[2]
    muts = parse(lst)
    if cmd == "check":
        for m in muts:
            lines = []
            for e in m["edits"]:
                _, text = locate(m, e, sys.argv[3])
                lines.append(text[: text.index(e["from"])].count("\n") + 1)
            files = ",".join(dict.fromkeys(e["file"] for e in m["edits"]))
            line = str(lines[0]) + (f"+{len(lines) - 1}" if len(lines) > 1 else "")
            acc = "1" if m.get("accept") else "0"
            print("\t".join([m["id"], files, line, acc, m["what"]]))
    elif cmd == "apply":
        m = find(muts, sys.argv[3])
        for e in m["edits"]:
            path, text = locate(m, e, sys.argv[4])
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(e["from"], e["to"], 1))
    elif cmd == "files":
        for f in dict.fromkeys(e["file"] for e in find(muts, sys.argv[3])["edits"]):
            print(f)
    elif cmd == "accept":
        print(find(muts, sys.argv[3]).get("accept", ""))
    else:
        die(f"unknown helper command {cmd}")


main()
PY

# Validate the whole list against the working tree first.
table=$(python3 "$helper" check "$list" "$root") || exit 2
if [ -n "$only" ]; then
  sel=""
  IFS=',' read -r -a want <<<"$only"
  for w in "${want[@]}"; do
    row=$(awk -F'\t' -v id="$w" '$1 == id' <<<"$table")
    [ -n "$row" ] || { echo "mutants.sh: no mutant $w in $list" >&2; exit 2; }
    sel+="$row"$'\n'
  done
  table=${sel%$'\n'}
fi
if [ "$ids_only" -eq 1 ]; then
  cut -f1,2,3 <<<"$table" | column -t
  exit 0
fi

# A scratch copy of the working tree (tracked and untracked-not-ignored
# files, mtimes kept so that unchanged crates stay fresh in the shared target
# folder). Files mutated by an earlier run are touched: their build products
# may come from a mutant.
mkdir -p "$work" "$logs"
rm -rf "$src"
mkdir -p "$src"
(cd "$root" && git ls-files -z -c -o --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | (cd "$src" && tar -xf -) || {
  echo "mutants.sh: copying the tree to $src failed" >&2
  exit 2
}
stamp=$work/mutated-files
cut -f2 <<<"$table" | tr ',' '\n' >>"$stamp"
sort -u -o "$stamp" "$stamp"
while read -r f; do
  [ -f "$src/$f" ] && touch "$src/$f"
done <"$stamp"

cd "$src" || exit 2
build=(cargo test "${pkgs[@]}" "${targets[@]}" --no-run)
run=(cargo test "${pkgs[@]}" "${targets[@]}")
echo "mutants.sh: scratch $src, CARGO_TARGET_DIR $CARGO_TARGET_DIR"
echo "mutants.sh: tests: ${run[*]}"

start=$(date +%s)
echo "mutants.sh: baseline (no mutant)"
if ! timeout --kill-after=10 "$timeout_s" "${build[@]}" >"$logs/baseline.log" 2>&1 ||
  ! timeout --kill-after=10 "$timeout_s" "${run[@]}" >>"$logs/baseline.log" 2>&1; then
  echo "mutants.sh: the unmutated tree fails its tests; see $logs/baseline.log" >&2
  tail -n 30 "$logs/baseline.log" >&2
  exit 2
fi
echo "mutants.sh: baseline passed in $(($(date +%s) - start)) s"

n=0 caught_test=0 caught_build=0 caught_timeout=0 survived=0 accepted=0 bad=0
rows=()
backup=$work/original
while IFS=$'\t' read -r id file line acc what; do
  n=$((n + 1))
  log=$logs/$id.log
  mapfile -t files < <(python3 "$helper" files "$list" "$id")
  rm -rf "$backup"
  mkdir -p "$backup"
  for k in "${!files[@]}"; do cp "$src/${files[$k]}" "$backup/$k"; done
  t0=$(date +%s)
  if ! python3 "$helper" apply "$list" "$id" "$src" 2>"$log"; then
    outcome="NOT APPLIED"
    bad=$((bad + 1))
  else
    timeout --kill-after=10 "$timeout_s" "${build[@]}" >>"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      outcome="timeout (build)"
      caught_timeout=$((caught_timeout + 1))
    elif [ "$rc" -ne 0 ]; then
      outcome="compile error"
      caught_build=$((caught_build + 1))
    else
      timeout --kill-after=10 "$timeout_s" "${run[@]}" >>"$log" 2>&1
      rc=$?
      if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        outcome="timeout"
        caught_timeout=$((caught_timeout + 1))
      elif [ "$rc" -ne 0 ]; then
        who=$(grep -m1 -E '^test .* FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/')
        [ -n "$who" ] || who=$(grep -m1 -E '^error: test failed' "$log")
        outcome="caught: ${who:-rc=$rc}"
        caught_test=$((caught_test + 1))
      elif [ "$acc" = 1 ]; then
        outcome="survived (accepted)"
        accepted=$((accepted + 1))
      else
        outcome="SURVIVED"
        survived=$((survived + 1))
      fi
    fi
  fi
  # a fresh mtime: the next build sees the change
  for k in "${!files[@]}"; do cp "$backup/$k" "$src/${files[$k]}"; done
  secs=$(($(date +%s) - t0))
  shown=${file//crates\/cachalot-core\/src\//}
  rows+=("$(printf '%-30s %-44s %-5s %5ss  %s' "$id" "$shown" "$line" "$secs" "$outcome")")
  printf 'mutants.sh: [%d] %s (%s): %s (%ss)\n' "$n" "$id" "$what" "$outcome" "$secs"
done <<<"$table"

echo
printf '%-30s %-44s %-5s %6s  %s\n' mutant "file (under crates/cachalot-core/src/)" line time outcome
for r in "${rows[@]}"; do echo "$r"; done
caught=$((caught_test + caught_build + caught_timeout))
echo
echo "score: $caught/$n caught ($caught_test by a failing test, $caught_build by the compiler, $caught_timeout by the timeout); $((survived + accepted)) survived ($accepted accepted)$([ "$bad" -gt 0 ] && echo "; $bad not applied")"
echo "total time $(($(date +%s) - start)) s; logs in $logs"
while IFS=$'\t' read -r id _ _ acc _; do
  [ "$acc" = 1 ] && echo "accepted survivor $id: $(python3 "$helper" accept "$list" "$id")"
done <<<"$table"
[ "$bad" -eq 0 ] || exit 2
[ "$survived" -eq 0 ]
