#!/usr/bin/env bash
# A/B on a GPU machine (copy into the folder `cargo xtask bench-cuda` packs, with an
# older CLI binary in old/): the current CLI (bin/) vs old/, alternating, plus PyTorch's torch_replay (bench/pytorch)
cd "$(dirname "$0")"
PASSES=5 RESULTS=$OUT/ab0 ./bench.sh > $OUT/ab_bench.txt 2>&1   # builds build/torch_replay, one full run
for i in 1 2; do
  for b in bin old; do
    $b/cachalot replay --backend cuda --json --passes 5 traces/*.trace | grep '^{' | sed "s/^{/{\"impl\":\"$b$i\",/" >> $OUT/ab.jsonl
  done
  build/torch_replay --passes=5 traces/*.trace | grep '^{' | sed "s/^{/{\"impl\":\"pt$i\",/" >> $OUT/ab.jsonl
done
python3 - <<'PY'
import json, os, collections
d = collections.defaultdict(dict)
for l in open(os.environ['OUT'] + '/ab.jsonl'):
    j = json.loads(l); d[j['trace'].split('/')[-1].replace('.trace', '')][j['impl']] = j['warm_ns_per_op']
impls = ['bin1', 'old1', 'pt1', 'bin2', 'old2', 'pt2']
print('trace'.ljust(22), ' '.join(i.rjust(7) for i in impls), '  new/pt  old/pt')
for t, v in d.items():
    r = lambda a, b: v[a] / v[b]
    print(t.ljust(22), ' '.join(f"{v.get(i, 0):7.1f}" for i in impls), f"  {r('bin1','pt1'):.2f}/{r('bin2','pt2'):.2f}  {r('old1','pt1'):.2f}/{r('old2','pt2'):.2f}")
PY
