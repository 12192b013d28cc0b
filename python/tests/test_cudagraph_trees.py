"""torch.compile(mode="reduce-overhead") on models whose path through the
tree of CUDA graphs diverges: a data-dependent branch, train/eval
switching, a dynamic shape. Each divergence makes cudagraph trees restore
the pool's checkpoint (getCheckpointState / setCheckpointPoolState) with
tensors of the old path still alive; the outputs must equal eager ones in
this process, and the compiled outputs must be the same under both
allocators (recorded digests, compared by the runner). The tests count the
restores to show that the checkpoint path ran."""

import contextlib
import copy
import hashlib

import torch

import _setup


@contextlib.contextmanager
def count_restores():
    """Counts torch._C._cuda_setCheckpointPoolState calls (cudagraph trees
    look the binding up at each call)."""
    calls = {"restore": 0, "save": 0}
    set_state, get_state = torch._C._cuda_setCheckpointPoolState, torch._C._cuda_getCheckpointState

    def counting_set(*args):
        calls["restore"] += 1
        return set_state(*args)

    def counting_get(*args):
        calls["save"] += 1
        return get_state(*args)

    torch._C._cuda_setCheckpointPoolState = counting_set
    torch._C._cuda_getCheckpointState = counting_get
    try:
        yield calls
    finally:
        torch._C._cuda_setCheckpointPoolState = set_state
        torch._C._cuda_getCheckpointState = get_state


def digest(tensors):
    return hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in tensors)).hexdigest()


def fresh_dynamo():
    torch._dynamo.reset()
    torch.cuda.synchronize()


class Branchy(torch.nn.Module):
    """A linear layer, then one of two heads chosen by the sign of the
    input's mean (a data-dependent branch: a graph break, and two paths
    after the first graph)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 256)
        self.up = torch.nn.Linear(256, 256)
        self.down = torch.nn.Linear(256, 256)

    def forward(self, x):
        h = self.a(x)
        if x.mean() > 0:
            return torch.relu(self.up(h)) * 2, h
        return torch.tanh(self.down(h)) - 1, h


def test_data_dependent_branch_restores_checkpoints():
    fresh_dynamo()
    torch.manual_seed(0)
    model = Branchy().cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    base = torch.randn(32, 64, device="cuda")
    # inputs whose branch alternates
    xs = []
    for i in range(8):
        x = base * (1.0 + 0.1 * i)
        positive = bool(x.mean() > 0)
        xs.append(x if positive == (i % 2 == 0) else -x)
    branches = [bool(x.mean() > 0) for x in xs]
    assert any(branches) and not all(branches), branches
    outs = []
    with torch.no_grad(), count_restores() as calls:
        for _ in range(3):
            for x in xs:
                y, h = compiled(x)
                ey, eh = model(x)
                torch.testing.assert_close(y, ey, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(h, eh, rtol=1e-4, atol=1e-4)
                outs += [y.clone(), h.clone()]
                del y, h
    torch.cuda.synchronize()
    assert calls["save"] > 0, calls
    assert calls["restore"] > 0, f"the path never diverged after a replay: {calls}"
    _setup.record_result("cudagraph_trees_branch_sha256", digest(outs))
    del compiled
    fresh_dynamo()


class TrainEval(torch.nn.Module):
    """Different graphs in train and eval mode (and a backward in train)."""

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(32, 128)
        self.l2 = torch.nn.Linear(128, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.l1(x))
        if self.training:
            h = h * 0.5 + 0.25
        return self.l2(h)


def test_train_eval_switching():
    fresh_dynamo()
    torch.manual_seed(1)
    model = TrainEval().cuda()
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.05)
    compiled = torch.compile(model, mode="reduce-overhead")
    xs = [torch.randn(16, 32, device="cuda") for _ in range(3)]
    xv = torch.randn(8, 32, device="cuda")
    outs = []
    with count_restores() as calls:
        for step in range(6):
            model.train()
            twin.train()
            for x in xs:
                opt.zero_grad(set_to_none=True)
                loss = compiled(x).square().mean()
                loss.backward()
                opt.step()
                opt_twin.zero_grad(set_to_none=True)
                twin_loss = twin(x).square().mean()
                twin_loss.backward()
                opt_twin.step()
                torch.testing.assert_close(loss, twin_loss, rtol=1e-3, atol=1e-4)
                outs.append(loss.detach().clone())
            model.eval()
            twin.eval()
            with torch.no_grad():
                y = compiled(xv)
                torch.testing.assert_close(y, twin(xv), rtol=1e-3, atol=1e-4)
                outs.append(y.clone())
                # an eval output kept alive across the switch back to train
                keep = y
            assert keep.shape == (8, 16), step
    torch.cuda.synchronize()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
    assert calls["save"] > 0, calls
    _setup.record_result("cudagraph_trees_train_eval_sha256", digest(outs))
    del compiled
    fresh_dynamo()


def test_dynamic_shapes():
    fresh_dynamo()
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.SiLU(), torch.nn.Linear(96, 48)).cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    sizes = [8, 16, 8, 32, 16, 8, 40, 32, 8]
    xs = {n: torch.randn(n, 48, device="cuda") for n in set(sizes)}
    outs = []
    kept = []
    with torch.no_grad(), count_restores() as calls:
        for _ in range(2):
            for n in sizes:
                y = compiled(xs[n])
                torch.testing.assert_close(y, model(xs[n]), rtol=1e-4, atol=1e-4)
                outs.append(y.clone())
                kept = [y]  # the last output alive while the next shape runs
    assert kept
    torch.cuda.synchronize()
    assert calls["save"] > 0, calls
    _setup.record_result("cudagraph_trees_dynamic_sha256", digest(outs))
    del compiled
    fresh_dynamo()
