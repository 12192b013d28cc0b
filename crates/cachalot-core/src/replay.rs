//! Allocation traces (the format of `shared/traces/README.md`), the
//! deterministic synthetic traces of `synth_traces.py`, and a replay that
//! measures the same figures as PyTorch's `cca_replay.cpp`.
#![forbid(unsafe_code)]

use std::path::Path;
use std::time::Instant;

use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::error::Error;

/// One trace operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on stream index `stream` as allocation `id`.
    Alloc {
        /// Allocation id (unique per trace).
        id: u32,
        /// Requested bytes.
        size: u64,
        /// Stream index (0 is the first stream seen).
        stream: u32,
    },
    /// Free allocation `id`.
    Free {
        /// Allocation id.
        id: u32,
    },
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// Name (file path or generator name).
    pub name: String,
    /// Operations in program order.
    pub ops: Vec<Op>,
    /// One more than the largest id.
    pub num_ids: usize,
    /// One more than the largest stream index.
    pub num_streams: u32,
}

/// A malformed trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line does not parse.
    #[error("{name}:{line}: {reason}")]
    Parse {
        /// Trace name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Trace {
    /// Parses trace text.
    pub fn parse(name: &str, text: &str) -> Result<Self, TraceError> {
        let mut ops = Vec::new();
        let (mut num_ids, mut num_streams) = (0usize, 0u32);
        let mut allocated: Vec<bool> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |reason: String| TraceError::Parse {
                name: name.to_string(),
                line: i + 1,
                reason,
            };
            let mut it = line.split_ascii_whitespace();
            let kind = it.next().unwrap_or("");
            let num = |s: Option<&str>, what: &str| -> Result<u64, TraceError> {
                s.ok_or_else(|| err(format!("missing {what}")))?
                    .parse::<u64>()
                    .map_err(|_| err(format!("bad {what}")))
            };
            let id = num(it.next(), "id")?;
            let id = u32::try_from(id).map_err(|_| err("id too large".into()))?;
            let op = match kind {
                "a" => {
                    let size = num(it.next(), "size")?;
                    let stream = u32::try_from(num(it.next(), "stream")?)
                        .map_err(|_| err("stream too large".into()))?;
                    if allocated.get(id as usize).copied().unwrap_or(false) {
                        return Err(err(format!("id {id} allocated twice")));
                    }
                    num_streams = num_streams.max(stream + 1);
                    Op::Alloc { id, size, stream }
                }
                "f" => Op::Free { id },
                other => return Err(err(format!("unknown operation '{other}'"))),
            };
            if it.next().is_some() {
                return Err(err("trailing fields".into()));
            }
            num_ids = num_ids.max(id as usize + 1);
            if allocated.len() < num_ids {
                allocated.resize(num_ids, false);
            }
            if let Op::Alloc { .. } = op {
                allocated[id as usize] = true;
            }
            ops.push(op);
        }
        Ok(Self {
            name: name.to_string(),
            ops,
            num_ids,
            num_streams,
        })
    }

    /// Reads and parses a trace file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// Renders the trace in the text format.
    pub fn to_text(&self) -> String {
        let mut s = format!("# trace {}\n", self.name);
        for op in &self.ops {
            match op {
                Op::Alloc { id, size, stream } => s.push_str(&format!("a {id} {size} {stream}\n")),
                Op::Free { id } => s.push_str(&format!("f {id}\n")),
            }
        }
        s
    }

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
        }
    }

    /// `churn_1stream` (seed 42) or `churn_4streams` (seed 43): 1000 live
    /// slots, 200,000 allocations of log-uniform sizes from 512 B to 64 MiB,
    /// bit-identical to `synth_traces.py` (Python's Mersenne Twister).
    pub fn churn(streams: u32, seed: u32) -> Self {
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
        }
    }

    /// A synthetic trace by name (`hit_1mib`, `churn_1stream`, `churn_4streams`).
    pub fn synthetic(name: &str) -> Option<Self> {
        match name {
            "hit_1mib" => Some(Self::hit_1mib()),
            "churn_1stream" => Some(Self::churn(1, 42)),
            "churn_4streams" => Some(Self::churn(4, 43)),
            _ => None,
        }
    }
}

/// Python's `random.Random(int_seed)`: MT19937 seeded by `init_by_array`.
struct PyRandom {
    mt: [u32; 624],
    idx: usize,
}

impl PyRandom {
    fn new(seed: u32) -> Self {
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

    fn next_u32(&mut self) -> u32 {
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

    fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)
    }

    fn uniform(&mut self, a: f64, b: f64) -> f64 {
        a + (b - a) * self.random()
    }

    /// `_randbelow(n)` via `getrandbits(n.bit_length())` with rejection.
    fn randbelow(&mut self, n: u32) -> u32 {
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.next_u32() >> (32 - k);
            if r < n {
                return r;
            }
        }
    }
}

/// Figures of one replay, with the fields of `cca_replay.cpp` first.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// Trace name.
    pub trace: String,
    /// Operations per pass.
    pub ops: usize,
    /// Host ns per operation on the first pass.
    pub cold_ns_per_op: f64,
    /// Median host ns per operation of the later passes.
    pub warm_ns_per_op: f64,
    /// Peak reserved bytes on the first pass.
    pub peak_reserved: i64,
    /// Peak allocated bytes on the first pass.
    pub peak_allocated: i64,
    /// Device allocations on the first pass.
    pub device_allocs_cold: i64,
    /// Device allocations over all passes.
    pub device_allocs_all: i64,
    /// Release-all retries over all passes.
    pub alloc_retries: i64,
    /// Device frees over all passes.
    pub device_frees_all: i64,
    /// Passes run.
    pub passes: usize,
}

impl ReplayReport {
    /// One JSON object with exactly the fields of `cca_replay.cpp`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"trace\":\"{}\",\"ops\":{},\"cold_ns_per_op\":{:.1},\"warm_ns_per_op\":{:.1},\"peak_reserved\":{},\"peak_allocated\":{},\"device_allocs_cold\":{},\"device_allocs_all\":{},\"alloc_retries\":{}}}",
            self.trace.replace('\\', "\\\\").replace('"', "\\\""),
            self.ops,
            self.cold_ns_per_op,
            self.warm_ns_per_op,
            self.peak_reserved,
            self.peak_allocated,
            self.device_allocs_cold,
            self.device_allocs_all,
            self.alloc_retries
        )
    }
}

/// One pass of `trace` through `alloc`: every op (stream index `i` maps to
/// `streams[i % streams.len()]`), then the blocks still live are freed.
/// `ptr` maps allocation ids to addresses (`trace.num_ids` entries, all 0
/// on entry and on return). `streams` must not be empty.
pub fn replay_pass<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    ptr: &mut [u64],
) -> Result<(), Error> {
    // stream index → stream, once (no division per operation)
    let map: Vec<B::Stream> = (0..trace.num_streams.max(1) as usize)
        .map(|i| streams[i % streams.len()])
        .collect();
    for op in &trace.ops {
        match *op {
            Op::Alloc { id, size, stream } => {
                let s = match map.get(stream as usize) {
                    Some(&s) => s,
                    None => streams[stream as usize % streams.len()],
                };
                ptr[id as usize] = alloc.allocate(size, s)?;
            }
            Op::Free { id } => {
                let p = std::mem::take(&mut ptr[id as usize]);
                if p != 0 {
                    alloc.free(p)?;
                }
            }
        }
    }
    for p in ptr.iter_mut() {
        if *p != 0 {
            alloc.free(std::mem::take(p))?;
        }
    }
    Ok(())
}

/// Replays `trace` `passes` times through `alloc` as `cca_replay.cpp` does:
/// empty the cache and reset stats first; each pass runs every op (stream
/// index `i` maps to `streams[i % streams.len()]`) then frees what is still
/// live. `progress` is called after each pass.
pub fn replay<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    passes: usize,
    mut progress: impl FnMut(usize),
) -> Result<ReplayReport, Error> {
    if streams.is_empty() {
        return Err(Error::InvalidArgument(
            "replay needs at least one stream".into(),
        ));
    }
    let passes = passes.max(1);
    alloc.empty_cache()?;
    alloc.reset_peak_stats();
    alloc.reset_accumulated_stats();
    let mut ptr = vec![0u64; trace.num_ids];
    let mut warm = Vec::new();
    let mut cold = (0.0, 0, 0, 0);
    for pass in 0..passes {
        let t0 = Instant::now();
        replay_pass(alloc, streams, trace, &mut ptr)?;
        let per = t0.elapsed().as_nanos() as f64 / trace.ops.len().max(1) as f64;
        if pass == 0 {
            let s = alloc.stats();
            cold = (
                per,
                s.reserved_bytes.all().peak,
                s.allocated_bytes.all().peak,
                s.num_device_alloc,
            );
        } else {
            warm.push(per);
        }
        progress(pass);
    }
    warm.sort_by(f64::total_cmp);
    let s = alloc.stats();
    Ok(ReplayReport {
        trace: trace.name.clone(),
        ops: trace.ops.len(),
        cold_ns_per_op: cold.0,
        warm_ns_per_op: if warm.is_empty() {
            cold.0
        } else {
            warm[warm.len() / 2]
        },
        peak_reserved: cold.1,
        peak_allocated: cold.2,
        device_allocs_cold: cold.3,
        device_allocs_all: s.num_device_alloc,
        alloc_retries: s.num_alloc_retries,
        device_frees_all: s.num_device_free,
        passes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_are_typed() {
        assert!(Trace::parse("t", "a 0 10 0\nf 0\n").is_ok());
        let e = Trace::parse("t", "a 0 10\n").unwrap_err();
        assert!(e.to_string().contains("t:1"), "{e}");
        assert!(Trace::parse("t", "x 1\n").is_err());
        assert!(Trace::parse("t", "a 0 10 0\na 0 5 0\n").is_err());
        assert!(Trace::parse("t", "a -1 10 0\n").is_err());
    }

    #[test]
    fn mersenne_twister_matches_python() {
        // python3 -c 'import random; r=random.Random(42); print([r.getrandbits(32) for _ in range(3)], r.random())'
        let mut r = PyRandom::new(42);
        assert_eq!(
            [r.next_u32(), r.next_u32(), r.next_u32()],
            [2746317213, 478163327, 107420369]
        );
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

    /// FNV-1a of the operation lines that `synth_traces.py` writes (the file
    /// minus its first comment line), computed from the Python output.
    #[test]
    fn synthetic_traces_match_python_generator() {
        for (name, hash, len) in [
            ("hit_1mib", 0x29db46d79cd3a7bu64, 2577780usize),
            ("churn_1stream", 0xe97d82f42bdf6515, 5120159),
            ("churn_4streams", 0x4de5af188b972a28, 5122109),
        ] {
            let text = Trace::synthetic(name).unwrap().to_text();
            let body = text.split_once('\n').unwrap().1;
            assert_eq!(body.len(), len, "{name}");
            assert_eq!(fnv1a(body.as_bytes()), hash, "{name}");
        }
    }
}

/// One row of the multi-thread benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadsReport {
    /// Threads, each allocating and freeing on its own stream.
    pub threads: usize,
    /// Operations over all threads.
    pub ops: u64,
    /// Millions of operations per second over all threads.
    pub mops_per_s: f64,
}

impl ThreadsReport {
    /// One JSON object with the fields of `cca_threads.cpp`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"threads\":{},\"ops\":{},\"mops_per_s\":{:.3}}}",
            self.threads, self.ops, self.mops_per_s
        )
    }
}

/// The workload of `cca_threads.cpp`: each thread owns a stream and 64 slots;
/// each op frees a random occupied slot or fills an empty one with
/// `512 << (r % 12)` bytes. A warm-up of 20,000 ops per thread fills the
/// caches; then `ops_per_thread` ops per thread are timed.
pub fn threads_bench<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    ops_per_thread: u64,
) -> Result<ThreadsReport, Error> {
    let work = |t: usize, ops: u64| -> Result<(), Error> {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1);
        let mut next = move || {
            // splitmix64
            rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut live = [0u64; 64];
        for _ in 0..ops {
            let k = (next() % 64) as usize;
            if live[k] != 0 {
                alloc.free(std::mem::take(&mut live[k]))?;
            } else {
                live[k] = alloc.allocate(512 << (next() % 12), streams[t])?;
            }
        }
        for p in live {
            if p != 0 {
                alloc.free(p)?;
            }
        }
        Ok(())
    };
    let run = |ops: u64| -> Result<(), Error> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..streams.len())
                .map(|t| sc.spawn(move || work(t, ops)))
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::InvalidArgument("bench thread panicked".into()))
                    })
                })
                .collect::<Result<Vec<()>, Error>>()
        })?;
        Ok(())
    };
    run(20_000)?;
    let t0 = Instant::now();
    run(ops_per_thread)?;
    let secs = t0.elapsed().as_secs_f64();
    let total = ops_per_thread * streams.len() as u64;
    Ok(ThreadsReport {
        threads: streams.len(),
        ops: total,
        mops_per_s: total as f64 / secs / 1e6,
    })
}
