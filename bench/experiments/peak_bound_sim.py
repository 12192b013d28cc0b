#!/usr/bin/env python3
"""Issue 18: can exact peaks skip the merge of the shards' stat logs?

Simulates `cachalot threads` (T threads, 64 slots each, sizes 512 B << 0..11)
and counts the windows (a flush when any shard logs W entries) in which the
bound "current + sum over shards of the highest prefix rise" exceeds the peak
so far: only in the others could the merge in stamp order be skipped.
Prints W, (windows failing the bound, windows) after a 20,000-op warm-up.
"""
import random
def sim(T=8, W=256, ops=400000, seed=1):
    rnd=random.Random(seed)
    live=[[0]*64 for _ in range(T)]
    cur={'n':0,'b':0}; peak={'n':0,'b':0}
    # warmup + measure
    fails=0; windows=0
    logs=[[] for _ in range(T)]
    def flush():
        nonlocal fails, windows
        windows+=1
        # bound check
        ok=True
        for k in ('n','b'):
            bound=cur[k]
            for t in range(T):
                s=0; m=0
                for d in logs[t]:
                    s+=d[k]; m=max(m,s)
                bound+=m
            if bound>peak[k]: ok=False
        # exact replay in random interleaving order (we keep global order list)
        return ok
    order=[]
    total=0
    for step in range(ops*T):
        t=rnd.randrange(T)
        k=rnd.randrange(64)
        if live[t][k]:
            d={'n':-1,'b':-live[t][k]}; live[t][k]=0
        else:
            s=512<<rnd.randrange(12); live[t][k]=s; d={'n':1,'b':s}
        logs[t].append(d); order.append(d)
        if len(logs[t])>=W:
            ok=flush()
            if not ok: fails+=1
            for dd in order:
                for kk in ('n','b'):
                    cur[kk]+=dd[kk]; peak[kk]=max(peak[kk],cur[kk])
            order=[]; logs=[[] for _ in range(T)]
        if step==20000*T: fails=0; windows=0
    return fails, windows
for W in (256,64,16):
    print(W, sim(W=W, ops=60000))
