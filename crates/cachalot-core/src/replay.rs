//! Allocation traces (the format of `shared/traces/README.md`), the
//! deterministic synthetic traces of `synth_traces.py` and
//! `serving_traces.py`, and a replay that
//! measures the same figures as PyTorch's `cca_replay.cpp`.
#![forbid(unsafe_code)]

mod run;
mod serving;
mod synth;
mod threads;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::{BufRead, Read};
use std::path::Path;

pub use run::{ReplayError, ReplayReport, replay, replay_pass};
use synth::PyRandom;
pub use threads::{ThreadsReport, threads_bench};

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
