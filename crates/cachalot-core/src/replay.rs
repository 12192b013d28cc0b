//! Allocation traces (the format of `shared/traces/README.md`), the
//! deterministic synthetic traces of `synth_traces.py` and
//! `serving_traces.py`, and a replay that
//! measures the same figures as PyTorch's `cca_replay.cpp`.
#![forbid(unsafe_code)]

mod serving;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::{BufRead, Read};
use std::path::Path;
use std::time::Instant;

use crate::backend::Backend;
use crate::engine::{CachingAllocator, PathCounts};
use crate::error::Error;

/// Most distinct stream numbers one trace may use (each becomes a real
/// stream of the device when it is replayed; PyTorch's own stream pool has
/// 32 per priority and device, so this is far above any recorded program).
pub const MAX_TRACE_STREAMS: u32 = 1024;

/// Most operations one trace may hold: 2^27 (134,217,728; the largest trace
/// shipped, `churn_4streams`, has 400,000). A parsed operation costs about
/// 64 bytes with its id bookkeeping, so the limit bounds a parse to about
/// 8 GiB, and every operation needs at least 4 bytes of trace text.
pub const MAX_TRACE_OPS: usize = 1 << 27;

/// Longest line of a trace, comments included (64 KiB; an operation line is
/// at most about 70 bytes). Bounds what one line may make the reader buffer.
pub const MAX_TRACE_LINE_BYTES: usize = 64 << 10;

/// One trace operation, with dense indices: the trace's own ids and stream
/// numbers (any `u64`) are renumbered `0..num_ids` and `0..num_streams` in
/// ascending order of the trace's values ([`Trace::id_value`] and
/// [`Trace::stream_value`] give them back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on stream index `stream` as allocation `id`.
    Alloc {
        /// Dense allocation index (unique per trace), `< Trace::num_ids`.
        id: u32,
        /// Requested bytes.
        size: u64,
        /// Dense stream index (0 is the lowest stream number), `< Trace::num_streams`.
        stream: u32,
    },
    /// Free allocation `id`.
    Free {
        /// Dense allocation index.
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
    /// Distinct allocation ids (one more than the largest dense id).
    pub num_ids: usize,
    /// Distinct streams (one more than the largest dense stream index).
    pub num_streams: u32,
    /// The trace's id of each dense id, ascending; empty when the dense ids
    /// are the trace's ids (the generated traces).
    pub id_values: Vec<u64>,
    /// The trace's stream number of each dense stream index, ascending;
    /// empty when they are the same.
    pub stream_values: Vec<u64>,
    /// The 1-based line of each operation in the trace text; empty for the
    /// generated traces.
    pub lines: Vec<usize>,
}

/// Limits that [`Trace::from_reader`] enforces; [`Default`] gives the
/// documented ones ([`MAX_TRACE_OPS`], [`MAX_TRACE_STREAMS`],
/// [`MAX_TRACE_LINE_BYTES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceLimits {
    /// Most operations.
    pub max_ops: usize,
    /// Most distinct stream numbers.
    pub max_streams: u32,
    /// Longest line in bytes, without its line break.
    pub max_line_bytes: usize,
}

impl Default for TraceLimits {
    fn default() -> Self {
        Self {
            max_ops: MAX_TRACE_OPS,
            max_streams: MAX_TRACE_STREAMS,
            max_line_bytes: MAX_TRACE_LINE_BYTES,
        }
    }
}

/// What is wrong with one line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The line is not UTF-8 text.
    #[error("the line is not UTF-8 text")]
    NotUtf8,
    /// The line is longer than the limit.
    #[error("the line is longer than {limit} bytes")]
    LineTooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// The first field is neither `a` nor `f`.
    #[error("unknown operation '{0}' (expected 'a ID SIZE STREAM' or 'f ID')")]
    UnknownOp(String),
    /// A field is missing.
    #[error("missing {0}")]
    Missing(&'static str),
    /// A field is not a decimal integer in `0..=u64::MAX`.
    #[error("bad {field} '{value}': expected an integer in 0..=18446744073709551615")]
    BadNumber {
        /// Which field (`id`, `size`, `stream`).
        field: &'static str,
        /// The text (cut to 40 characters).
        value: String,
    },
    /// A field follows the last one of the operation.
    #[error("unexpected field '{0}' after the operation")]
    TrailingField(String),
    /// An id is allocated a second time (ids are unique per trace).
    #[error("id {id} allocated twice (first on line {first_line}; ids are unique per trace)")]
    AllocatedTwice {
        /// The trace's id.
        id: u64,
        /// Line of its first allocation.
        first_line: usize,
    },
    /// A free of an id that no earlier line allocates.
    #[error("free of id {id}, which no earlier line allocates")]
    UnknownId {
        /// The trace's id.
        id: u64,
    },
    /// A second free of an id.
    #[error("id {id} freed twice (first on line {first_line})")]
    FreedTwice {
        /// The trace's id.
        id: u64,
        /// Line of its first free.
        first_line: usize,
    },
    /// A stream number beyond the most distinct streams a trace may use.
    #[error("stream {stream} would be distinct stream number {}, above the limit of {limit}", *limit as u64 + 1)]
    TooManyStreams {
        /// The trace's stream number.
        stream: u64,
        /// The limit on distinct streams.
        limit: u32,
    },
    /// More operations than the limit.
    #[error("more than {limit} operations")]
    TooManyOps {
        /// The limit.
        limit: usize,
    },
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
    /// A line does not parse, or breaks a rule of the format or a limit.
    #[error("{name}:{line}: {kind}")]
    Parse {
        /// Trace name.
        name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        kind: ParseErrorKind,
    },
    /// The trace has no operation (an empty file, or only comments).
    #[error("{name}: the trace has no operations (empty, or only comments and blank lines)")]
    Empty {
        /// Trace name.
        name: String,
    },
}

/// `s` cut to 40 characters, for an error message.
fn excerpt(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// Sentinel of "not freed" in the parser's per-id table.
const LIVE: usize = usize::MAX;

/// Dense indices given in first-seen order, renumbered by ascending value:
/// the sorted values and, per old index, its new one; `None` when the
/// first-seen order already ascends.
fn rank_order(values: &[u64]) -> Option<(Vec<u64>, Vec<u32>)> {
    if values.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    order.sort_unstable_by_key(|&i| values[i as usize]);
    let mut new_of_old = vec![0u32; values.len()];
    for (rank, &old) in order.iter().enumerate() {
        new_of_old[old as usize] = rank as u32;
    }
    Some((
        order.iter().map(|&i| values[i as usize]).collect(),
        new_of_old,
    ))
}

impl Trace {
    /// Parses trace text with the default [`TraceLimits`].
    pub fn parse(name: &str, text: &str) -> Result<Self, TraceError> {
        Self::from_reader(name, text.as_bytes(), &TraceLimits::default())
    }

    /// Reads and parses a trace file with the default [`TraceLimits`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_reader(
            &path.display().to_string(),
            std::io::BufReader::new(file),
            &TraceLimits::default(),
        )
    }

    /// Parses a trace from `reader` (named `name` in errors), line by line:
    /// memory stays proportional to the operations, whatever the ids and
    /// stream numbers are. Ids and stream numbers may be any `u64`; they are
    /// renumbered densely (see [`Op`]). Errors, naming the line and value:
    /// a malformed line, an id allocated twice, a free of an id no earlier
    /// line allocates, a second free, a limit of `limits` exceeded; and a
    /// trace without operations.
    pub fn from_reader(
        name: &str,
        mut reader: impl BufRead,
        limits: &TraceLimits,
    ) -> Result<Self, TraceError> {
        // Dense indices fit in u32 (ops are bounded by this too).
        let max_ops = limits.max_ops.min(u32::MAX as usize);
        let mut ops = Vec::new();
        let mut lines: Vec<usize> = Vec::new();
        // trace id → dense id; per dense id: its value, the op allocating it,
        // the op freeing it (LIVE while live)
        let mut id_map: HashMap<u64, u32> = HashMap::new();
        let mut id_values: Vec<u64> = Vec::new();
        let mut alloc_op: Vec<usize> = Vec::new();
        let mut free_op: Vec<usize> = Vec::new();
        let mut stream_map: HashMap<u64, u32> = HashMap::new();
        let mut stream_values: Vec<u64> = Vec::new();
        let mut buf = Vec::new();
        let mut line_no = 0usize;
        loop {
            buf.clear();
            let n = (&mut reader)
                .take(limits.max_line_bytes.saturating_add(1) as u64)
                .read_until(b'\n', &mut buf)
                .map_err(|source| TraceError::Io {
                    path: name.to_string(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            line_no = line_no.saturating_add(1);
            let err = |kind: ParseErrorKind| TraceError::Parse {
                name: name.to_string(),
                line: line_no,
                kind,
            };
            if buf.last() == Some(&b'\n') {
                buf.pop();
            } else if buf.len() > limits.max_line_bytes {
                return Err(err(ParseErrorKind::LineTooLong {
                    limit: limits.max_line_bytes,
                }));
            }
            let line = std::str::from_utf8(&buf)
                .map_err(|_| err(ParseErrorKind::NotUtf8))?
                .trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if ops.len() >= max_ops {
                return Err(err(ParseErrorKind::TooManyOps { limit: max_ops }));
            }
            let mut it = line.split_ascii_whitespace();
            let kind = it.next().unwrap_or("");
            let num = |s: Option<&str>, field: &'static str| -> Result<u64, TraceError> {
                let s = s.ok_or_else(|| err(ParseErrorKind::Missing(field)))?;
                s.parse::<u64>().map_err(|_| {
                    err(ParseErrorKind::BadNumber {
                        field,
                        value: excerpt(s),
                    })
                })
            };
            let op = match kind {
                "a" => {
                    let id = num(it.next(), "id")?;
                    let size = num(it.next(), "size")?;
                    let stream = num(it.next(), "stream")?;
                    if let Some(extra) = it.next() {
                        return Err(err(ParseErrorKind::TrailingField(excerpt(extra))));
                    }
                    let next = id_values.len() as u32;
                    let dense = match id_map.entry(id) {
                        Entry::Occupied(e) => {
                            let first_line = lines[alloc_op[*e.get() as usize]];
                            return Err(err(ParseErrorKind::AllocatedTwice { id, first_line }));
                        }
                        Entry::Vacant(e) => *e.insert(next),
                    };
                    let stream_ix = match stream_map.get(&stream) {
                        Some(&s) => s,
                        None => {
                            let s = stream_values.len() as u32;
                            if s >= limits.max_streams {
                                return Err(err(ParseErrorKind::TooManyStreams {
                                    stream,
                                    limit: limits.max_streams,
                                }));
                            }
                            stream_map.insert(stream, s);
                            stream_values.push(stream);
                            s
                        }
                    };
                    id_values.push(id);
                    alloc_op.push(ops.len());
                    free_op.push(LIVE);
                    Op::Alloc {
                        id: dense,
                        size,
                        stream: stream_ix,
                    }
                }
                "f" => {
                    let id = num(it.next(), "id")?;
                    if let Some(extra) = it.next() {
                        return Err(err(ParseErrorKind::TrailingField(excerpt(extra))));
                    }
                    let dense = *id_map
                        .get(&id)
                        .ok_or_else(|| err(ParseErrorKind::UnknownId { id }))?;
                    let freed = &mut free_op[dense as usize];
                    if *freed != LIVE {
                        let first_line = lines[*freed];
                        return Err(err(ParseErrorKind::FreedTwice { id, first_line }));
                    }
                    *freed = ops.len();
                    Op::Free { id: dense }
                }
                other => return Err(err(ParseErrorKind::UnknownOp(excerpt(other)))),
            };
            ops.push(op);
            lines.push(line_no);
        }
        if ops.is_empty() {
            return Err(TraceError::Empty {
                name: name.to_string(),
            });
        }
        // Ascending order of the trace's values: a trace numbered 0, 1, ...
        // keeps its numbers, and the end-of-pass frees run in id order.
        let id_map = rank_order(&id_values);
        let stream_map = rank_order(&stream_values);
        if id_map.is_some() || stream_map.is_some() {
            for op in &mut ops {
                match op {
                    Op::Alloc { id, stream, .. } => {
                        if let Some((_, m)) = &id_map {
                            *id = m[*id as usize];
                        }
                        if let Some((_, m)) = &stream_map {
                            *stream = m[*stream as usize];
                        }
                    }
                    Op::Free { id } => {
                        if let Some((_, m)) = &id_map {
                            *id = m[*id as usize];
                        }
                    }
                }
            }
        }
        if let Some((sorted, _)) = id_map {
            id_values = sorted;
        }
        if let Some((sorted, _)) = stream_map {
            stream_values = sorted;
        }
        let dense_ids = id_values.iter().enumerate().all(|(i, &v)| v == i as u64);
        let dense_streams = stream_values
            .iter()
            .enumerate()
            .all(|(i, &v)| v == i as u64);
        Ok(Self {
            name: name.to_string(),
            ops,
            num_ids: id_values.len(),
            num_streams: stream_values.len() as u32,
            id_values: if dense_ids { Vec::new() } else { id_values },
            stream_values: if dense_streams {
                Vec::new()
            } else {
                stream_values
            },
            lines,
        })
    }

    /// The trace's id of dense id `id`.
    pub fn id_value(&self, id: u32) -> u64 {
        self.id_values
            .get(id as usize)
            .copied()
            .unwrap_or(u64::from(id))
    }

    /// The trace's stream number of dense stream index `stream`.
    pub fn stream_value(&self, stream: u32) -> u64 {
        self.stream_values
            .get(stream as usize)
            .copied()
            .unwrap_or(u64::from(stream))
    }

    /// The 1-based line of operation `op` in the trace text (`None` for a
    /// generated trace or an index out of range).
    pub fn line_of(&self, op: usize) -> Option<usize> {
        self.lines.get(op).copied()
    }

    /// Operation `op` in the text format, with the trace's own ids and
    /// stream numbers (`None` for an index out of range).
    pub fn op_text(&self, op: usize) -> Option<String> {
        self.ops.get(op).map(|o| self.render(o))
    }

    fn render(&self, op: &Op) -> String {
        match *op {
            Op::Alloc { id, size, stream } => format!(
                "a {} {size} {}",
                self.id_value(id),
                self.stream_value(stream)
            ),
            Op::Free { id } => format!("f {}", self.id_value(id)),
        }
    }

    /// Renders the trace in the text format, with the trace's own ids and
    /// stream numbers.
    pub fn to_text(&self) -> String {
        let mut s = format!("# trace {}\n", self.name);
        for op in &self.ops {
            s.push_str(&self.render(op));
            s.push('\n');
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

/// A failed replay: the allocator's error and, when an operation hit it,
/// which one (its index, its line in the trace text and its text).
#[derive(Debug, thiserror::Error)]
pub struct ReplayError {
    /// Trace name (the CLI puts the file path here).
    pub trace: String,
    /// Index of the failing operation (`None`: before the first operation,
    /// or freeing the blocks live at the end of a pass).
    pub op_index: Option<usize>,
    /// Its 1-based line in the trace text (`None` for a generated trace).
    pub line: Option<usize>,
    /// Its text, with the trace's own id and stream numbers.
    pub op: Option<String>,
    /// The allocator's error (boxed: the error stays small to return).
    #[source]
    pub source: Box<Error>,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.trace)?;
        match (self.line, self.op_index) {
            (Some(line), _) => write!(f, ":{line}")?,
            (None, Some(i)) => write!(f, ": operation {i}")?,
            (None, None) => {}
        }
        if let Some(op) = &self.op {
            write!(f, ": '{op}'")?;
        }
        write!(f, ": {}", self.source)
    }
}

impl ReplayError {
    /// `source` hit at operation `op_index` of `trace`.
    pub fn at(trace: &Trace, op_index: usize, source: Error) -> Self {
        Self {
            trace: trace.name.clone(),
            op_index: Some(op_index),
            line: trace.line_of(op_index),
            op: trace.op_text(op_index),
            source: Box::new(source),
        }
    }

    /// `source` outside any one operation of `trace`.
    pub fn whole(trace: &Trace, source: Error) -> Self {
        Self {
            trace: trace.name.clone(),
            op_index: None,
            line: None,
            op: None,
            source: Box::new(source),
        }
    }
}

/// Checks that `streams` and `ptr` cover `trace` (no stream is folded onto
/// another: dense stream index `i` runs on `streams[i]`).
fn check_replay_args<S>(streams: &[S], trace: &Trace, ptr_len: usize) -> Result<(), ReplayError> {
    let need = (trace.num_streams as usize).max(1);
    if streams.len() < need {
        return Err(ReplayError::whole(
            trace,
            Error::InvalidArgument(format!(
                "the trace uses {need} streams but {} were given",
                streams.len()
            )),
        ));
    }
    if ptr_len < trace.num_ids {
        return Err(ReplayError::whole(
            trace,
            Error::InvalidArgument(format!(
                "the trace has {} ids but the address table has {ptr_len} entries",
                trace.num_ids
            )),
        ));
    }
    Ok(())
}

/// One pass of `trace` through `alloc`: every op (dense stream index `i`
/// on `streams[i]`), then the blocks still live are freed. `ptr` maps
/// allocation ids to addresses (at least `trace.num_ids` entries, all 0 on
/// entry and on return). `streams` must hold at least
/// `trace.num_streams.max(1)` streams, else an error (streams are never
/// folded onto each other); so must an op naming an id or stream beyond
/// them (a trace built by hand).
pub fn replay_pass<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    ptr: &mut [u64],
) -> Result<(), ReplayError> {
    check_replay_args(streams, trace, ptr.len())?;
    let bad = |i: usize, what: String| ReplayError::at(trace, i, Error::InvalidArgument(what));
    for (i, op) in trace.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, stream } => {
                let Some(&s) = streams.get(stream as usize) else {
                    return Err(bad(i, format!("stream index {stream} out of range")));
                };
                let Some(slot) = ptr.get_mut(id as usize) else {
                    return Err(bad(i, format!("id {id} out of range")));
                };
                *slot = alloc
                    .allocate(size, s)
                    .map_err(|e| ReplayError::at(trace, i, e))?;
            }
            Op::Free { id } => {
                let Some(slot) = ptr.get_mut(id as usize) else {
                    return Err(bad(i, format!("id {id} out of range")));
                };
                let p = std::mem::take(slot);
                if p != 0 {
                    alloc.free(p).map_err(|e| ReplayError::at(trace, i, e))?;
                }
            }
        }
    }
    for p in ptr.iter_mut() {
        if *p != 0 {
            alloc
                .free(std::mem::take(p))
                .map_err(|e| ReplayError::whole(trace, e))?;
        }
    }
    Ok(())
}

/// Replays `trace` `passes` times through `alloc` as `cca_replay.cpp` does:
/// empty the cache and reset stats first; each pass runs every op (dense
/// stream index `i` on `streams[i]`; fewer streams than the trace uses is
/// an error) then frees what is still live. `progress` is called after
/// each pass.
pub fn replay<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    passes: usize,
    mut progress: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    check_replay_args(streams, trace, trace.num_ids)?;
    let whole = |e| ReplayError::whole(trace, e);
    let passes = passes.max(1);
    alloc.empty_cache().map_err(whole)?;
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

    /// The kind and line of a parse error (panics on success or another error).
    fn parse_err(text: &str) -> (usize, ParseErrorKind) {
        parse_err_with(text, &TraceLimits::default())
    }

    fn parse_err_with(text: &str, limits: &TraceLimits) -> (usize, ParseErrorKind) {
        match Trace::from_reader("t", text.as_bytes(), limits) {
            Err(TraceError::Parse { name, line, kind }) => {
                assert_eq!(name, "t");
                (line, kind)
            }
            other => panic!("expected a parse error for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn parse_errors_are_typed() {
        assert!(Trace::parse("t", "a 0 10 0\nf 0\n").is_ok());
        let e = Trace::parse("t", "a 0 10\n").unwrap_err();
        assert!(e.to_string().contains("t:1"), "{e}");
        assert_eq!(
            parse_err("a 0 10\n"),
            (1, ParseErrorKind::Missing("stream"))
        );
        assert_eq!(
            parse_err("# c\nx 1\n"),
            (2, ParseErrorKind::UnknownOp("x".into()))
        );
        assert_eq!(
            parse_err("a 0 10 0\na 0 5 0\n"),
            (
                2,
                ParseErrorKind::AllocatedTwice {
                    id: 0,
                    first_line: 1
                }
            )
        );
        assert_eq!(
            parse_err("a -1 10 0\n"),
            (
                1,
                ParseErrorKind::BadNumber {
                    field: "id",
                    value: "-1".into()
                }
            )
        );
        assert_eq!(
            parse_err("a 0 10 0 9\n"),
            (1, ParseErrorKind::TrailingField("9".into()))
        );
        assert_eq!(
            parse_err("a 0 10 0\nf 0 0\n"),
            (2, ParseErrorKind::TrailingField("0".into()))
        );
        // u64::MAX + 1 is not a number of the format; a long value is cut
        let (line, kind) = parse_err(&format!("a 0 18446744073709551616 {}\n", "9".repeat(500)));
        assert_eq!(line, 1);
        assert_eq!(
            kind,
            ParseErrorKind::BadNumber {
                field: "size",
                value: "18446744073709551616".into()
            }
        );
        let (_, kind) = parse_err(&format!("a 0 1 {}x\n", "9".repeat(500)));
        assert!(kind.to_string().len() < 200, "{kind}");
        assert!(kind.to_string().contains("..."), "{kind}");
        let raw: &[u8] = b"a 0 1 0\n\xff 1\n";
        match Trace::from_reader("t", raw, &TraceLimits::default()) {
            Err(TraceError::Parse { line: 2, kind, .. }) => {
                assert_eq!(kind, ParseErrorKind::NotUtf8)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn huge_ids_are_renumbered_not_indexed() {
        let t = Trace::parse("t", "a 4294967295 100 0\n").unwrap();
        assert_eq!((t.num_ids, t.num_streams), (1, 1));
        assert_eq!(t.id_value(0), 4294967295);
        let text = "a 18446744073709551615 100 0\na 7 5 0\nf 18446744073709551615\n";
        let t = Trace::parse("t", text).unwrap();
        assert_eq!(t.num_ids, 2);
        // dense ids follow the trace's ids in ascending order
        assert_eq!(
            t.ops,
            vec![
                Op::Alloc {
                    id: 1,
                    size: 100,
                    stream: 0
                },
                Op::Alloc {
                    id: 0,
                    size: 5,
                    stream: 0
                },
                Op::Free { id: 1 },
            ]
        );
        assert_eq!(t.id_values, vec![7, u64::MAX]);
        assert_eq!(t.lines, vec![1, 2, 3]);
        // the text keeps the trace's own ids
        assert_eq!(t.to_text().split_once('\n').unwrap().1, text);
        assert_eq!(t.op_text(2).as_deref(), Some("f 18446744073709551615"));
    }

    #[test]
    fn huge_stream_numbers_are_renumbered_not_folded() {
        let text = "a 0 100 4000000000\na 1 5 7\na 2 5 18446744073709551615\na 3 1 7\n";
        let t = Trace::parse("t", text).unwrap();
        assert_eq!(t.num_streams, 3);
        assert_eq!(t.stream_values, vec![7, 4000000000, u64::MAX]);
        let streams: Vec<u32> = t
            .ops
            .iter()
            .map(|op| match op {
                Op::Alloc { stream, .. } => *stream,
                Op::Free { .. } => panic!("no frees"),
            })
            .collect();
        assert_eq!(streams, vec![1, 0, 2, 0]);
        assert_eq!(t.stream_value(1), 4000000000);
        assert_eq!(t.to_text().split_once('\n').unwrap().1, text);
        // 17 streams stay 17 streams
        let many: String = (0..17)
            .map(|i| format!("a {i} 512 {}\n", i * 1000))
            .collect();
        assert_eq!(Trace::parse("t", &many).unwrap().num_streams, 17);
    }

    #[test]
    fn frees_of_unknown_or_freed_ids_are_errors() {
        assert_eq!(
            parse_err("f 4000000000\n"),
            (1, ParseErrorKind::UnknownId { id: 4000000000 })
        );
        // a free before the allocation is a free of an unknown id
        assert_eq!(
            parse_err("a 1 10 0\nf 2\na 2 10 0\n"),
            (2, ParseErrorKind::UnknownId { id: 2 })
        );
        assert_eq!(
            parse_err("a 5 10 0\n# x\nf 5\n\nf 5\n"),
            (
                5,
                ParseErrorKind::FreedTwice {
                    id: 5,
                    first_line: 3
                }
            )
        );
        // ids are unique per trace: no reuse after a free
        assert_eq!(
            parse_err("a 5 10 0\nf 5\na 5 10 0\n"),
            (
                3,
                ParseErrorKind::AllocatedTwice {
                    id: 5,
                    first_line: 1
                }
            )
        );
        let e = Trace::parse("t", "a 0 1 0\nf 3\n").unwrap_err().to_string();
        assert!(e.contains("t:2") && e.contains("id 3"), "{e}");
    }

    #[test]
    fn empty_trace_is_an_error() {
        for text in ["", "\n\n", "# only a comment\n   \n# another\n"] {
            match Trace::parse("t", text) {
                Err(TraceError::Empty { name }) => assert_eq!(name, "t"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let e = Trace::parse("empty.trace", "").unwrap_err().to_string();
        assert!(
            e.contains("empty.trace") && e.contains("no operations"),
            "{e}"
        );
    }

    #[test]
    fn limits_are_enforced_with_the_line() {
        let limits = TraceLimits {
            max_ops: 3,
            max_streams: 2,
            max_line_bytes: 16,
        };
        assert_eq!(
            parse_err_with("a 0 1 0\na 1 1 9\na 2 1 10\n", &limits),
            (
                3,
                ParseErrorKind::TooManyStreams {
                    stream: 10,
                    limit: 2
                }
            )
        );
        assert_eq!(
            parse_err_with("a 0 1 0\nf 0\na 1 1 0\n# c\nf 1\n", &limits),
            (5, ParseErrorKind::TooManyOps { limit: 3 })
        );
        // 16 bytes pass (with or without a line break), 17 do not
        let ok = format!("a 0 1 0\n#{}\n#{}", "x".repeat(15), "y".repeat(15));
        assert!(Trace::from_reader("t", ok.as_bytes(), &limits).is_ok());
        assert_eq!(
            parse_err_with(&format!("a 0 1 0\n#{}\n", "x".repeat(16)), &limits),
            (2, ParseErrorKind::LineTooLong { limit: 16 })
        );
        // the default stream limit: 1024 distinct streams, not 1025
        let mut text: String = (0..MAX_TRACE_STREAMS)
            .map(|i| format!("a {i} 512 {}\n", u64::from(i) << 20))
            .collect();
        assert_eq!(
            Trace::parse("t", &text).unwrap().num_streams,
            MAX_TRACE_STREAMS
        );
        text.push_str("a 99999 512 77\n");
        assert_eq!(
            parse_err(&text),
            (
                MAX_TRACE_STREAMS as usize + 1,
                ParseErrorKind::TooManyStreams {
                    stream: 77,
                    limit: MAX_TRACE_STREAMS
                }
            )
        );
    }

    /// The recorded traces parse, keep their own numbers (dense already)
    /// and render back to their operation lines.
    #[test]
    fn recorded_traces_parse_unchanged() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces");
        for name in ["gpt2_train", "resnet50_train", "side_stream_pipeline"] {
            let path = dir.join(format!("{name}.trace"));
            let text = std::fs::read_to_string(&path).unwrap();
            let t = Trace::load(&path).unwrap();
            assert!(
                t.id_values.is_empty() && t.stream_values.is_empty(),
                "{name}"
            );
            let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
            let ours = t.to_text();
            let ours: Vec<&str> = ours.lines().filter(|l| !l.starts_with('#')).collect();
            assert_eq!(body, ours, "{name}");
        }
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

/// One row of the multi-thread benchmark.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadsReport {
    /// Threads, each allocating and freeing on its own stream.
    pub threads: usize,
    /// Operations over all threads.
    pub ops: u64,
    /// Millions of operations per second over all threads.
    pub mops_per_s: f64,
    /// How the timed operations were served, summed over the threads
    /// ([`PathCounts`]).
    pub paths: PathCounts,
    /// Device allocations (segments created) during the timed operations.
    pub device_allocs: i64,
}

impl ThreadsReport {
    /// One JSON object with the fields of `cca_threads.cpp`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"threads\":{},\"ops\":{},\"mops_per_s\":{:.3},\"fast\":{},\"device\":{},\"flushes\":{},\"device_allocs\":{}}}",
            self.threads,
            self.ops,
            self.mops_per_s,
            self.paths.fast,
            self.paths.device,
            self.paths.flushes,
            self.device_allocs
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
    if streams.is_empty() {
        return Err(Error::InvalidArgument(
            "the threads benchmark needs at least one stream".into(),
        ));
    }
    let work = |t: usize, ops: u64| -> Result<PathCounts, Error> {
        let before = PathCounts::this_thread();
        let mut rng =
            crate::rng::SplitMix64::new(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t as u64 + 1));
        let mut next = move || rng.next_u64();
        let mut live = [0u64; 64];
        for _ in 0..ops {
            let k = (next() % 64) as usize;
            if live[k] != 0 {
                alloc.free(std::mem::take(&mut live[k]))?;
            } else {
                live[k] = alloc.allocate(512 << (next() % 12), streams[t])?;
            }
        }
        let counts = PathCounts::this_thread().since(&before);
        for p in live {
            if p != 0 {
                alloc.free(p)?;
            }
        }
        Ok(counts)
    };
    let run = |ops: u64| -> Result<PathCounts, Error> {
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
                .collect::<Result<Vec<PathCounts>, Error>>()
        })
        .map(|v| v.iter().fold(PathCounts::default(), |a, c| a.plus(c)))
    };
    run(20_000)?;
    let allocs0 = alloc.stats().num_device_alloc;
    let t0 = Instant::now();
    let paths = run(ops_per_thread)?;
    let secs = t0.elapsed().as_secs_f64();
    let device_allocs = alloc.stats().num_device_alloc - allocs0;
    let total = ops_per_thread.saturating_mul(streams.len() as u64);
    Ok(ThreadsReport {
        threads: streams.len(),
        ops: total,
        mops_per_s: total as f64 / secs / 1e6,
        paths,
        device_allocs,
    })
}
