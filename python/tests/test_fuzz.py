"""A random allocator workout with data integrity: random sizes (512 B to
20 MiB), frees, empty_cache, side streams with record_stream; every live
tensor keeps its own value; the stats stay consistent."""

import random

import torch

import _setup
from test_stats import check_consistency

STEPS = 3000


def test_allocator_fuzz_keeps_data():
    rng = random.Random(1234)
    side = torch.cuda.Stream()
    live = []  # (tensor, value)
    total = 0
    limit = 1 << 30
    for step in range(STEPS):
        r = rng.random()
        if r < 0.5 and total < limit:
            n = rng.randint(128, 5 << 20)  # float32: 512 B .. 20 MiB
            v = float(rng.randint(1, 1 << 20))
            if rng.random() < 0.2:
                with torch.cuda.stream(side):
                    t = torch.full((n,), v, device="cuda")
                torch.cuda.current_stream().wait_stream(side)
                t.record_stream(torch.cuda.current_stream())
            else:
                t = torch.full((n,), v, device="cuda")
            live.append((t, v))
            total += n * 4
        elif r < 0.93 and live:
            t, v = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.2:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    t.mul_(1.0)
                t.record_stream(side)
            total -= t.numel() * 4
            del t
        elif r < 0.96:
            torch.cuda.empty_cache()
        else:
            for t, v in live:
                assert float(t.min()) == v and float(t.max()) == v, step
        if step % 500 == 0:
            check_consistency()
    for t, v in live:
        assert float(t.min()) == v and float(t.max()) == v
    live.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    check_consistency()
    _setup.record_result("fuzz_steps", STEPS)
