"""CUDA tensors between processes (torch.multiprocessing, CUDA IPC): a
producer process sends a tensor and a view of it, a consumer process on
the same GPU reads them, checks the data and writes into them; the
producer sees the writes. While the consumer holds the tensor, the
producer drops its own reference and allocates again: no new allocation
may alias the shared memory, and the memory stays allocated until the
consumer lets go (then `torch.cuda.ipc_collect()` frees it).

Each process chooses its allocator (native PyTorch or cachalot) and the
producer its segments (fixed or expandable). The suite's own process is
only the conductor: in the native run of the suite the producer is
native, in the cachalot run it is cachalot (with the run's
CACHALOT_ALLOC_CONF), and the consumer is each of the two, so one run of
both covers the four pairings."""

import os
import queue as queue_mod

import pytest
import torch

import _ipc_child
import _setup

TIMEOUT = _ipc_child.TIMEOUT


def _run_pair(producer, producer_conf, consumer, n=_ipc_child.N):
    mp = torch.multiprocessing.get_context("spawn")
    tensors, to_producer, to_consumer, out = mp.Queue(), mp.Queue(), mp.Queue(), mp.Queue()
    env_before = {k: os.environ.get(k) for k in ("CACHALOT_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    # each child sets its own settings: none inherited
    for k in env_before:
        os.environ.pop(k, None)
    try:
        p = mp.Process(target=_ipc_child.producer, args=(producer, producer_conf, tensors, to_producer, to_consumer, out, n))
        c = mp.Process(target=_ipc_child.consumer, args=(consumer, tensors, to_producer, to_consumer, out, n))
        p.start()
        c.start()
        results = {}
        try:
            for _ in range(2):
                who, what = out.get(timeout=3 * TIMEOUT)
                results[who] = what
        except queue_mod.Empty:
            pass
        p.join(30)
        c.join(30)
        for proc in (p, c):
            if proc.is_alive():
                proc.kill()
                proc.join()
    finally:
        for k, v in env_before.items():
            if v is not None:
                os.environ[k] = v
    return results


SEGMENTS = {"fixed": "expandable_segments:False", "expandable": "expandable_segments:True"}


@pytest.mark.parametrize("consumer", ["native", "cachalot"])
@pytest.mark.parametrize("segments", ["fixed", "expandable"])
def test_tensor_crosses_processes(consumer, segments):
    producer = "cachalot" if _setup.is_cachalot() else "native"
    conf = SEGMENTS[segments]
    if producer == "cachalot":
        run_conf = os.environ.get("CACHALOT_ALLOC_CONF", "")
        conf = f"{run_conf},{conf}" if run_conf else conf
    results = _run_pair(producer, conf, consumer)
    assert results.get("producer") == "ok" and results.get("consumer") == "ok", \
        f"{producer} ({conf}) -> {consumer}: {results}"
    _setup.record_result(f"ipc_{segments}_to_{consumer}", "ok")


@pytest.mark.parametrize("consumer", ["native", "cachalot"])
def test_a_tensor_over_page_runs_of_two_sizes(consumer):
    """A fresh 6 MiB tensor in expandable segments: in cachalot's mode a run
    of two 2 MiB pages and a run of one, which PyTorch's handle format (one
    page size) cannot describe. cachalot sends it in its own format: a
    consumer on cachalot opens it as any other; one on native PyTorch
    refuses it with PyTorch's error. PyTorch's expandable mode (and
    cachalot's placement:pytorch) has pages of one size: every pairing
    works."""
    producer = "cachalot" if _setup.is_cachalot() else "native"
    conf = SEGMENTS["expandable"]
    run_conf = os.environ.get("CACHALOT_ALLOC_CONF", "") if producer == "cachalot" else ""
    if run_conf:
        conf = f"{run_conf},{conf}"
    runs = producer == "cachalot" and "placement:pytorch" not in conf
    results = _run_pair(producer, conf, consumer, n=3 << 19)
    if runs and consumer == "native":
        assert results.get("producer") != "ok", results
        assert "shareable handle type" in str(results.get("consumer")), results
    else:
        assert results.get("producer") == "ok" and results.get("consumer") == "ok", \
            f"{producer} ({conf}) -> {consumer}: {results}"
    _setup.record_result(f"ipc_runs_to_{consumer}", "ok")
