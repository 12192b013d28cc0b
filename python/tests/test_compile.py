"""torch.compile(mode="reduce-overhead") (cudagraph trees: private pools,
checkPoolLiveAllocations, checkpoint state) on a small model gives the
eager outputs, and the same outputs under both allocators."""

import hashlib

import torch

import _setup


def test_reduce_overhead_small_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)).cuda().eval()
    xs = [torch.randn(64, 128, device="cuda", generator=None) for _ in range(4)]
    compiled = torch.compile(model, mode="reduce-overhead")
    outs = []
    with torch.no_grad():
        for _ in range(3):  # warm-up, record, replays
            for x in xs:
                y = compiled(x)
                outs.append(y.clone())
                torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-5)
    torch.cuda.synchronize()
    digest = hashlib.sha256(b"".join(o.cpu().numpy().tobytes() for o in outs)).hexdigest()
    _setup.record_result("compile_reduce_overhead_sha256", digest)
