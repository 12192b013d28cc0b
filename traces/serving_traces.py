"""Synthetic serving traces with random shapes (deterministic), in the format of
the recorded ones (README.md): what PyTorch's allocator sees when a BERT-base
model answers requests of random batch x length, and when GPT-2 small
generates text for random prompts with a key/value cache that grows a token
at a time. Sizes follow the models' tensors in fp16 (eager attention, the
scores of every head materialized); a tensor is allocated where the model
computes it and freed after its last use.

    python3 serving_traces.py OUTDIR [--requests-bert N] [--requests-gpt2 N]

writes OUTDIR/bert_serving.trace and OUTDIR/gpt2_generate.trace. The same
arguments give the same files byte for byte (seeded `random.Random`).
"""
import argparse
import os
import random

FP16 = 2
HIDDEN, HEADS, FFN, LAYERS = 768, 12, 3072, 12


class Trace:
    def __init__(self):
        self.lines = []
        self.next_id = 0

    def alloc(self, size, stream=0):
        i = self.next_id
        self.next_id += 1
        self.lines.append(f"a {i} {size} {stream}")
        return i

    def free(self, *ids):
        for i in ids:
            self.lines.append(f"f {i}")

    def write(self, path, note):
        with open(path, "w") as f:
            f.write(f"# {note}\n")
            f.write("\n".join(self.lines))
            f.write("\n")


def weights(t, shapes):
    """Parameters: allocated once, live to the end."""
    return [t.alloc(r * c * FP16) for r, c in shapes]


def attention(t, x, b, q_len, kv_len, wide):
    """Eager self-attention over `q_len` queries and `kv_len` keys; returns
    the output projection, with the residual and layer norm after it when
    `wide` (BERT's post-norm block); the input `x` is not freed."""
    h = b * q_len * HIDDEN * FP16
    scores = b * HEADS * q_len * kv_len * FP16
    s = t.alloc(scores)           # q @ k^T
    s2 = t.alloc(scores)          # scaled, masked
    t.free(s)
    p = t.alloc(scores)           # softmax
    t.free(s2)
    ctx = t.alloc(h)              # p @ v
    t.free(p)
    ctx2 = t.alloc(h)             # heads merged (contiguous)
    t.free(ctx)
    o = t.alloc(h)                # output projection
    t.free(ctx2)
    if not wide:
        return o
    r = t.alloc(h)                # residual
    t.free(o)
    n = t.alloc(h)                # layer norm
    t.free(r)
    return n


def mlp(t, x, b, q_len):
    h = b * q_len * HIDDEN * FP16
    inter = t.alloc(b * q_len * FFN * FP16)
    g = t.alloc(b * q_len * FFN * FP16)  # gelu
    t.free(inter)
    o = t.alloc(h)
    t.free(g)
    r = t.alloc(h)                # residual
    t.free(o)
    n = t.alloc(h)                # layer norm
    t.free(r)
    return n


def bert(requests, seed):
    """BERT-base inference: each request a random batch (1..48) of random
    length (16..512), as `python/client_memory.py` sends them."""
    rng = random.Random(seed)
    t = Trace()
    shapes = [(30522, HIDDEN), (512, HIDDEN), (2, HIDDEN), (2, HIDDEN)]
    for _ in range(LAYERS):
        shapes += [(HIDDEN, HIDDEN)] * 4 + [(1, HIDDEN)] * 8 + [(HIDDEN, FFN), (1, FFN), (FFN, HIDDEN)]
    shapes += [(HIDDEN, HIDDEN), (1, HIDDEN)]
    weights(t, shapes)
    for _ in range(requests):
        b, s = rng.randint(1, 48), rng.randint(16, 512)
        h = b * s * HIDDEN * FP16
        ids = t.alloc(b * s * 8)
        mask = t.alloc(b * s * 8)
        ext = t.alloc(b * s * FP16)
        e1 = t.alloc(h)           # word embeddings
        e2 = t.alloc(h)           # + position, type
        t.free(e1)
        x = t.alloc(h)            # layer norm
        t.free(e2)
        for _ in range(LAYERS):
            q, k, v = t.alloc(h), t.alloc(h), t.alloc(h)
            a = attention(t, x, b, s, s, True)
            t.free(q, k, v)
            y = mlp(t, a, b, s)
            t.free(a, x)
            x = y
        pooled = t.alloc(b * HIDDEN * FP16)
        out = t.alloc(b * HIDDEN * FP16)
        t.free(pooled, x, ext, mask, ids, out)
    return t


def gpt2(requests, seed):
    """GPT-2 small generation: each request a random batch (1..8) of random
    prompts (16..512 tokens) continued by a random number of tokens
    (16..128); every layer's keys and values grow by one token per step
    (`torch.cat` into a new tensor, the old one freed), as a dynamic cache
    does."""
    rng = random.Random(seed)
    t = Trace()
    shapes = [(50257, HIDDEN), (1024, HIDDEN)]
    for _ in range(LAYERS):
        shapes += [(1, HIDDEN)] * 4 + [(HIDDEN, 3 * HIDDEN), (1, 3 * HIDDEN), (HIDDEN, HIDDEN), (1, HIDDEN)]
        shapes += [(HIDDEN, FFN), (1, FFN), (FFN, HIDDEN), (1, HIDDEN)]
    shapes += [(1, HIDDEN), (1, HIDDEN)]
    weights(t, shapes)
    kv_bytes = lambda b, n: b * HEADS * n * (HIDDEN // HEADS) * FP16
    for _ in range(requests):
        b, prompt, new = rng.randint(1, 8), rng.randint(16, 512), rng.randint(16, 128)
        ids = t.alloc(b * prompt * 8)
        cache = []
        n = prompt
        q_len = prompt
        for step in range(new + 1):
            h = b * q_len * HIDDEN * FP16
            e = t.alloc(h)        # token + position embeddings
            x = t.alloc(h)
            t.free(e)
            for layer in range(LAYERS):
                ln = t.alloc(h)
                qkv = t.alloc(3 * h)
                if step == 0:
                    k = t.alloc(kv_bytes(b, n))
                    v = t.alloc(kv_bytes(b, n))
                    cache.append([k, v])
                else:
                    k = t.alloc(kv_bytes(b, n))   # cat(past keys, new key)
                    t.free(cache[layer][0])
                    v = t.alloc(kv_bytes(b, n))
                    t.free(cache[layer][1])
                    cache[layer] = [k, v]
                a = attention(t, ln, b, q_len, n, False)
                t.free(qkv, ln)
                x2 = t.alloc(h)   # residual
                t.free(a, x)
                ln2 = t.alloc(h)
                y = mlp(t, ln2, b, q_len)
                t.free(ln2)
                x3 = t.alloc(h)   # residual
                t.free(y, x2)
                x = x3
            lnf = t.alloc(b * HIDDEN * FP16)      # last position only
            logits = t.alloc(b * 50257 * 4)       # fp32
            probs = t.alloc(b * 50257 * 4)
            tok = t.alloc(b * 8)
            t.free(probs, logits, lnf, x)
            ids2 = t.alloc(b * (n + 1) * 8)       # cat(ids, token)
            t.free(ids, tok)
            ids = ids2
            n += 1
            q_len = 1
        for k, v in cache:
            t.free(k, v)
        t.free(ids)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--requests-bert", type=int, default=200)
    ap.add_argument("--requests-gpt2", type=int, default=12)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    bert(a.requests_bert, 1234).write(
        os.path.join(a.outdir, "bert_serving.trace"),
        f"trace bert_serving: BERT-base fp16 inference, {a.requests_bert} requests of random batch 1-48 x length 16-512, seed 1234 (serving_traces.py)",
    )
    gpt2(a.requests_gpt2, 4321).write(
        os.path.join(a.outdir, "gpt2_generate.trace"),
        f"trace gpt2_generate: GPT-2 small fp16 generation, {a.requests_gpt2} requests of random batch 1-8, prompt 16-512, 16-128 new tokens, a growing key/value cache, seed 4321 (serving_traces.py)",
    )


if __name__ == "__main__":
    main()
