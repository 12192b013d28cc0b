//! The deterministic synthetic traces of `synth_traces.py` and
//! `serving_traces.py`, and the Python random generator they are drawn from.

use super::{Op, Trace, serving};

impl Trace {
    /// `hit_1mib`: the same 1 MiB block allocated and freed 100,000 times.
    pub fn hit_1mib() -> Self {
        let mut ops = Vec::with_capacity(200_000);
        for i in 0..100_000 {
            ops.push(Op::Alloc {
                id: i,
                size: 1 << 20,
                stream: 0,
            });
            ops.push(Op::Free { id: i });
        }
        Self {
            name: "hit_1mib".into(),
            ops,
            num_ids: 100_000,
            num_streams: 1,
            id_values: Vec::new(),
            stream_values: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// `churn_1stream` (seed 42) or `churn_4streams` (seed 43): 1000 live
    /// slots, 200,000 allocations of log-uniform sizes from 512 B to 64 MiB,
    /// bit-identical to `synth_traces.py` (Python's Mersenne Twister).
    /// `streams` 0 is taken as 1.
    pub fn churn(streams: u32, seed: u32) -> Self {
        let streams = streams.max(1);
        let name = if streams == 1 {
            "churn_1stream".to_string()
        } else {
            format!("churn_{streams}streams")
        };
        let (ops_n, slots) = (200_000u32, 1000u32);
        let mut rng = PyRandom::new(seed);
        let mut live: Vec<Option<u32>> = vec![None; slots as usize];
        let mut ops = Vec::with_capacity(2 * ops_n as usize);
        let (lo, hi) = ((512f64).ln(), ((64u64 << 20) as f64).ln());
        for nid in 0..ops_n {
            let k = rng.randbelow(slots) as usize;
            if let Some(old) = live[k] {
                ops.push(Op::Free { id: old });
            }
            let size = rng.uniform(lo, hi).exp() as u64;
            let stream = rng.randbelow(streams);
            ops.push(Op::Alloc {
                id: nid,
                size,
                stream,
            });
            live[k] = Some(nid);
        }
        Self {
            name,
            ops,
            num_ids: ops_n as usize,
            num_streams: streams,
            id_values: Vec::new(),
            stream_values: Vec::new(),
            lines: Vec::new(),
        }
    }

    /// `bert_serving`: BERT-base fp16 inference, `requests` requests of a
    /// random batch (1..48) of random length (16..512), each tensor
    /// allocated where the model computes it and freed after its last use;
    /// bit-identical to `traces/serving_traces.py --requests-bert N`.
    pub fn bert_serving(requests: u32) -> Self {
        serving::bert(requests)
    }

    /// `gpt2_generate`: GPT-2 small fp16 generation, `requests` requests of
    /// a random batch (1..8) of random prompts (16..512 tokens) continued by
    /// 16..128 tokens, every layer's keys and values growing a token a step
    /// (a new tensor, the old one freed); bit-identical to
    /// `traces/serving_traces.py --requests-gpt2 N`.
    pub fn gpt2_generate(requests: u32) -> Self {
        serving::gpt2(requests)
    }

    /// A synthetic trace by name (`hit_1mib`, `churn_1stream`,
    /// `churn_4streams`, and the serving traces with random shapes
    /// `bert_serving` and `gpt2_generate`, with 200 and 12 requests).
    pub fn synthetic(name: &str) -> Option<Self> {
        match name {
            "hit_1mib" => Some(Self::hit_1mib()),
            "churn_1stream" => Some(Self::churn(1, 42)),
            "churn_4streams" => Some(Self::churn(4, 43)),
            "bert_serving" => Some(Self::bert_serving(serving::BERT_REQUESTS)),
            "gpt2_generate" => Some(Self::gpt2_generate(serving::GPT2_REQUESTS)),
            _ => None,
        }
    }
}

/// Python's `random.Random(int_seed)`: MT19937 seeded by `init_by_array`.
pub(super) struct PyRandom {
    mt: [u32; 624],
    idx: usize,
}

impl PyRandom {
    pub(super) fn new(seed: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = 19650218;
        for i in 1..624 {
            mt[i] = 1812433253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        let key = [seed];
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..624.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1664525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..623 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1566083941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= 624 {
                mt[0] = mt[623];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        Self { mt, idx: 624 }
    }

    pub(super) fn next_u32(&mut self) -> u32 {
        if self.idx >= 624 {
            for k in 0..624 {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(k + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.idx = 0;
        }
        let mut y = self.mt[self.idx];
        self.idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    pub(super) fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)
    }

    pub(super) fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `_randbelow(n)` via `getrandbits(n.bit_length())` with rejection.
    pub(super) fn randbelow(&mut self, n: u32) -> u32 {
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.next_u32() >> (32 - k);
            if r < n {
                return r;
            }
        }
    }
}

#[cfg(test)]
mod synth_check {
    use super::*;

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// FNV-1a of the operation lines that `synth_traces.py` and
    /// `serving_traces.py` write (the file minus its first comment line),
    /// computed from the Python output.
    #[test]
    fn synthetic_traces_match_python_generator() {
        for (name, hash, len) in [
            ("hit_1mib", 0x29db46d79cd3a7bu64, 2577780usize),
            ("churn_1stream", 0xe97d82f42bdf6515, 5120159),
            ("churn_4streams", 0x4de5af188b972a28, 5122109),
            // `serving_traces.py` with its default request counts
            ("bert_serving", 0x66b8a74a28e1ce2b, 1035595),
            ("gpt2_generate", 0xd1ed7cb84f32e4aa, 4071034),
        ] {
            let text = Trace::synthetic(name).unwrap().to_text();
            let body = text.split_once('\n').unwrap().1;
            assert_eq!(body.len(), len, "{name}");
            assert_eq!(fnv1a(body.as_bytes()), hash, "{name}");
        }
    }
}
