//! Synthetic serving traces with random shapes: `bert_serving` (BERT-base
//! inference, random batch × length) and `gpt2_generate` (GPT-2 small
//! generation, random prompts continued token by token with a key/value
//! cache that grows). Bit-identical to `traces/serving_traces.py` (Python's
//! Mersenne Twister, the same seeds and request counts): sizes follow the
//! models' fp16 tensors with eager attention (every head's scores
//! materialized), each allocated where the model computes it and freed
//! after its last use.

use super::{Op, PyRandom, Trace};

const FP16: u64 = 2;
const HIDDEN: u64 = 768;
const HEADS: u64 = 12;
const FFN: u64 = 3072;
const LAYERS: usize = 12;

/// Requests of `bert_serving` (as `serving_traces.py`'s default).
pub(super) const BERT_REQUESTS: u32 = 200;
/// Requests of `gpt2_generate` (as `serving_traces.py`'s default).
pub(super) const GPT2_REQUESTS: u32 = 12;

/// A trace being written: allocations numbered in order, on stream 0.
#[derive(Default)]
struct Gen {
    ops: Vec<Op>,
    next: u32,
}

impl Gen {
    fn alloc(&mut self, size: u64) -> u32 {
        let id = self.next;
        self.next += 1;
        self.ops.push(Op::Alloc {
            id,
            size,
            stream: 0,
        });
        id
    }

    fn free(&mut self, ids: &[u32]) {
        self.ops.extend(ids.iter().map(|&id| Op::Free { id }));
    }

    /// Parameters (rows × columns of fp16), allocated once, live to the end.
    fn weights(&mut self, shapes: &[(u64, u64)]) {
        for &(r, c) in shapes {
            self.alloc(r * c * FP16);
        }
    }

    /// Eager self-attention over `q` queries and `kv` keys of a batch of
    /// `b`: the output projection, and with `wide` (BERT's post-norm block)
    /// the residual and the layer norm after it.
    fn attention(&mut self, b: u64, q: u64, kv: u64, wide: bool) -> u32 {
        let h = b * q * HIDDEN * FP16;
        let scores = b * HEADS * q * kv * FP16;
        let s = self.alloc(scores);
        let s2 = self.alloc(scores);
        self.free(&[s]);
        let p = self.alloc(scores);
        self.free(&[s2]);
        let ctx = self.alloc(h);
        self.free(&[p]);
        let ctx2 = self.alloc(h);
        self.free(&[ctx]);
        let o = self.alloc(h);
        self.free(&[ctx2]);
        if !wide {
            return o;
        }
        let r = self.alloc(h);
        self.free(&[o]);
        let n = self.alloc(h);
        self.free(&[r]);
        n
    }

    /// The feed-forward block, its residual and layer norm.
    fn mlp(&mut self, b: u64, q: u64) -> u32 {
        let h = b * q * HIDDEN * FP16;
        let inter = self.alloc(b * q * FFN * FP16);
        let g = self.alloc(b * q * FFN * FP16);
        self.free(&[inter]);
        let o = self.alloc(h);
        self.free(&[g]);
        let r = self.alloc(h);
        self.free(&[o]);
        let n = self.alloc(h);
        self.free(&[r]);
        n
    }

    fn into_trace(self, name: &str) -> Trace {
        Trace {
            name: name.into(),
            num_ids: self.next as usize,
            ops: self.ops,
            num_streams: 1,
            id_values: Vec::new(),
            stream_values: Vec::new(),
            lines: Vec::new(),
        }
    }
}

/// Python's `randint(a, b)`.
fn randint(rng: &mut PyRandom, a: u32, b: u32) -> u64 {
    u64::from(a + rng.randbelow(b - a + 1))
}

/// `bert_serving`: BERT-base inference, `requests` requests of a random
/// batch (1..48) of random length (16..512), seed 1234.
pub(super) fn bert(requests: u32) -> Trace {
    let mut rng = PyRandom::new(1234);
    let mut t = Gen::default();
    let mut shapes = vec![(30522, HIDDEN), (512, HIDDEN), (2, HIDDEN), (2, HIDDEN)];
    for _ in 0..LAYERS {
        shapes.extend([(HIDDEN, HIDDEN); 4]);
        shapes.extend([(1, HIDDEN); 8]);
        shapes.extend([(HIDDEN, FFN), (1, FFN), (FFN, HIDDEN)]);
    }
    shapes.extend([(HIDDEN, HIDDEN), (1, HIDDEN)]);
    t.weights(&shapes);
    for _ in 0..requests {
        let b = randint(&mut rng, 1, 48);
        let s = randint(&mut rng, 16, 512);
        let h = b * s * HIDDEN * FP16;
        let ids = t.alloc(b * s * 8);
        let mask = t.alloc(b * s * 8);
        let ext = t.alloc(b * s * FP16);
        let e1 = t.alloc(h);
        let e2 = t.alloc(h);
        t.free(&[e1]);
        let mut x = t.alloc(h);
        t.free(&[e2]);
        for _ in 0..LAYERS {
            let (q, k, v) = (t.alloc(h), t.alloc(h), t.alloc(h));
            let a = t.attention(b, s, s, true);
            t.free(&[q, k, v]);
            let y = t.mlp(b, s);
            t.free(&[a, x]);
            x = y;
        }
        let pooled = t.alloc(b * HIDDEN * FP16);
        let out = t.alloc(b * HIDDEN * FP16);
        t.free(&[pooled, x, ext, mask, ids, out]);
    }
    t.into_trace("bert_serving")
}

/// `gpt2_generate`: GPT-2 small generation, `requests` requests of a
/// random batch (1..8) of random prompts (16..512 tokens) continued by a
/// random number of tokens (16..128), seed 4321; every layer's keys and
/// values grow by one token per step (a new tensor, the old one freed).
pub(super) fn gpt2(requests: u32) -> Trace {
    let mut rng = PyRandom::new(4321);
    let mut t = Gen::default();
    let mut shapes = vec![(50257, HIDDEN), (1024, HIDDEN)];
    for _ in 0..LAYERS {
        shapes.extend([(1, HIDDEN); 4]);
        shapes.extend([
            (HIDDEN, 3 * HIDDEN),
            (1, 3 * HIDDEN),
            (HIDDEN, HIDDEN),
            (1, HIDDEN),
        ]);
        shapes.extend([(HIDDEN, FFN), (1, FFN), (FFN, HIDDEN), (1, HIDDEN)]);
    }
    shapes.extend([(1, HIDDEN), (1, HIDDEN)]);
    t.weights(&shapes);
    let kv_bytes = |b: u64, n: u64| b * HEADS * n * (HIDDEN / HEADS) * FP16;
    for _ in 0..requests {
        let b = randint(&mut rng, 1, 8);
        let prompt = randint(&mut rng, 16, 512);
        let new = randint(&mut rng, 16, 128);
        let mut ids = t.alloc(b * prompt * 8);
        let mut cache: Vec<[u32; 2]> = Vec::with_capacity(LAYERS);
        let (mut n, mut q) = (prompt, prompt);
        for step in 0..=new {
            let h = b * q * HIDDEN * FP16;
            let e = t.alloc(h);
            let mut x = t.alloc(h);
            t.free(&[e]);
            for layer in 0..LAYERS {
                let ln = t.alloc(h);
                let qkv = t.alloc(3 * h);
                if step == 0 {
                    let k = t.alloc(kv_bytes(b, n));
                    let v = t.alloc(kv_bytes(b, n));
                    cache.push([k, v]);
                } else {
                    let k = t.alloc(kv_bytes(b, n));
                    t.free(&[cache[layer][0]]);
                    let v = t.alloc(kv_bytes(b, n));
                    t.free(&[cache[layer][1]]);
                    cache[layer] = [k, v];
                }
                let a = t.attention(b, q, n, false);
                t.free(&[qkv, ln]);
                let x2 = t.alloc(h);
                t.free(&[a, x]);
                let ln2 = t.alloc(h);
                let y = t.mlp(b, q);
                t.free(&[ln2]);
                let x3 = t.alloc(h);
                t.free(&[y, x2]);
                x = x3;
            }
            let lnf = t.alloc(b * HIDDEN * FP16);
            let logits = t.alloc(b * 50257 * 4);
            let probs = t.alloc(b * 50257 * 4);
            let tok = t.alloc(b * 8);
            t.free(&[probs, logits, lnf, x]);
            let ids2 = t.alloc(b * (n + 1) * 8);
            t.free(&[ids, tok]);
            ids = ids2;
            n += 1;
            q = 1;
        }
        for [k, v] in cache {
            t.free(&[k, v]);
        }
        t.free(&[ids]);
    }
    t.into_trace("gpt2_generate")
}
