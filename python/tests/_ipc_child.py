"""The two processes of test_ipc.py (a module of its own: spawned children
import it, and it imports nothing of the test runner's)."""

import os
import sys
import time
from pathlib import Path

import torch

N = 1 << 20  # float32 elements: 4 MiB
TIMEOUT = 120


def _install(allocator, conf):
    """In a fresh process, before CUDA initializes."""
    if allocator == "native" and conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if allocator == "cachalot":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import cachalot_torch

        cachalot_torch.install(conf or None)
        assert torch.cuda.memory.get_allocator_backend() == "cachalot"
    else:
        if conf:
            torch.cuda.memory._set_allocator_settings(conf)


def producer(allocator, conf, tensors, to_producer, to_consumer, out, n=N):
    try:
        _install(allocator, conf)
        t = torch.arange(n, dtype=torch.float32, device="cuda")
        view = t[n // 2:]
        torch.cuda.synchronize()
        ptr, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        seg = [s for s in torch.cuda.memory_snapshot()
               if s["address"] <= ptr < s["address"] + s["total_size"]]
        assert len(seg) == 1, seg
        want_expandable = "expandable_segments:True" in conf
        assert bool(seg[0].get("is_expandable")) == want_expandable, (conf, seg[0].get("is_expandable"))
        tensors.put((t, view))
        assert to_producer.get(timeout=TIMEOUT) == "written"
        torch.cuda.synchronize()
        # the consumer's writes are visible here
        torch.testing.assert_close(t, torch.arange(n, dtype=torch.float32, device="cuda") * 2 + 1)
        held = torch.cuda.memory_allocated()
        del t, view
        torch.cuda.synchronize()
        # the consumer still holds it: allocate again, nothing may alias it
        fresh = [torch.empty(n, dtype=torch.float32, device="cuda") for _ in range(8)]
        for f in fresh:
            a = f.untyped_storage().data_ptr()
            assert a + f.untyped_storage().nbytes() <= ptr or a >= ptr + nbytes, \
                f"a new allocation at {a:#x} aliases the shared block at {ptr:#x} while the consumer holds it"
        for f in fresh:
            f.fill_(-7.0)  # would overwrite the consumer's data if it aliased
        torch.cuda.synchronize()
        still = torch.cuda.memory_allocated() - 8 * n * 4
        assert still >= held, f"the shared block was freed while the consumer holds it ({still} < {held})"
        del fresh, f  # (the loop variable holds the last one)
        to_consumer.put("check-again")
        assert to_producer.get(timeout=TIMEOUT) == "released"
        # the consumer's release reaches the producer's reference count
        # when its storage is deallocated; collect until it did
        deadline = time.monotonic() + 30
        while True:
            torch.cuda.ipc_collect()
            torch.cuda.synchronize()
            after = torch.cuda.memory_allocated()
            if after <= held - nbytes or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert after <= held - nbytes, f"released by the consumer but still allocated ({after} > {held} - {nbytes})"
        out.put(("producer", "ok"))
    except BaseException as e:  # reported to the conductor
        out.put(("producer", f"{type(e).__name__}: {e}"))
        tensors.put(None)  # (if nothing was sent yet)
        to_consumer.put("abort")


def consumer(allocator, tensors, to_producer, to_consumer, out, n=N):
    try:
        _install(allocator, "")
        item = tensors.get(timeout=TIMEOUT)
        if item is None:
            out.put(("consumer", "nothing received: the producer failed"))
            return
        t, view = item
        del item  # only t and view hold the received tensors
        assert t.is_cuda and view.is_cuda
        assert view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        want = torch.arange(n, dtype=torch.float32, device="cuda")
        torch.testing.assert_close(t, want)
        torch.testing.assert_close(view, want[n // 2:])
        t.mul_(2).add_(1)
        torch.cuda.synchronize()
        to_producer.put("written")
        msg = to_consumer.get(timeout=TIMEOUT)
        if msg == "abort":
            out.put(("consumer", "aborted by the producer"))
            return
        # the producer allocated and wrote -7 everywhere it could: not here
        torch.testing.assert_close(t, want * 2 + 1)
        del t, view
        torch.cuda.synchronize()
        to_producer.put("released")
        out.put(("consumer", "ok"))
    except BaseException as e:
        out.put(("consumer", f"{type(e).__name__}: {e}"))
        to_producer.put("abort")
