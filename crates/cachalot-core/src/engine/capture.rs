//! Reuse of blocks freed with cross-stream uses during graph capture
//! (PyTorch PR #158352 with #162186's terminals-as-markers and incremental
//! reachability), plus cachalot's `cross_stream` mode.
//!
//! A block freed during capture while it has cross-stream uses gets free
//! markers: the terminal node sets, at free time, of its allocation stream and
//! of every stream that used it. Every later node of a stream whose `visited`
//! set (ancestors-or-self of every terminal the stream has had in this
//! capture) holds all markers is ordered after every use of the block, so the
//! block may be reused by that stream.
//!
//! `pytorch` mode (PyTorch 2.11): only the block's allocation stream may
//! reclaim it (R2), at its mallocs.
//!
//! `cross_stream` mode adds, when a stream's own search misses:
//! * deferred blocks of other streams whose markers are all in the
//!   requesting stream's visited set;
//! * free blocks cached under other streams of the same capture. Every time
//!   memory of the capture becomes free (a free, a reclaim, a re-keying), the
//!   freed range is logged with the freeing stream's terminals at that moment
//!   (a snapshot); a later use of that memory by the freeing stream is
//!   ordered after them. A free block may move to another stream once every
//!   snapshot logged over its bytes is in that stream's visited set. Memory
//!   never freed in the capture (a fresh segment's remainder, or blocks left
//!   from an earlier capture into a shared pool) carries no captured use.
//!
//! Every capture-time check queries only the capture graph (terminal sets and
//! node dependencies), never an event.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::backend::{Backend, CaptureStatus, GraphCapture, NodeOf};
use crate::config::CaptureReuse;
use crate::engine::state::{BState, BlockId, Inner, Params, PoolFilter, PoolIdx, ReuseContext};
use crate::error::{BackendError, CaptureError, Error};

/// A fast hasher for graph nodes (small ids or pointers).
#[derive(Default, Clone, Copy)]
pub(crate) struct NodeHasher(u64);

impl NodeHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517C_C1B7_2722_0A95);
    }
}

impl Hasher for NodeHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }
}

/// A map keyed by streams, capture ids or nodes, with the fast hasher.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<NodeHasher>>;

/// Capture status and id of `stream`, its terminals written into
/// `terminals`: "not capturing" on a backend without capture.
#[inline]
pub(crate) fn capture_state<B: Backend>(
    backend: &B,
    stream: B::Stream,
    terminals: &mut Vec<NodeOf<B>>,
) -> Result<(CaptureStatus, u64), BackendError> {
    match backend.capture() {
        Some(c) => c.capture_state(stream, terminals),
        None => {
            terminals.clear();
            Ok((CaptureStatus::None, 0))
        }
    }
}

/// The capture id of `stream` if it is capturing (status active).
pub(crate) fn active_capture_id<B: Backend>(
    backend: &B,
    stream: B::Stream,
) -> Result<Option<u64>, BackendError> {
    let mut terminals = Vec::new();
    let (status, id) = capture_state(backend, stream, &mut terminals)?;
    Ok((status == CaptureStatus::Active).then_some(id))
}

/// The backend's capture interface; only asked for once a stream was seen
/// capturing, which a backend without capture never reports.
fn graph<B: Backend>(backend: &B) -> Result<&B::Capture, Error> {
    backend
        .capture()
        .ok_or_else(|| CaptureError::Unsupported(backend.name()).into())
}

/// Largest node number a visited bitset grows to (2^26 nodes, 8 MiB): a
/// larger number from the backend is treated as unnumbered.
const MAX_NODE_NUMBER: u32 = 1 << 26;

/// Sets bit `i`; true when it was clear.
#[inline]
fn bit_set(bits: &mut Vec<u64>, i: u32) -> bool {
    let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
    if w >= bits.len() {
        bits.resize(w + 1, 0);
    }
    let new = bits[w] & m == 0;
    bits[w] |= m;
    new
}

/// Whether bit `i` is set.
#[inline]
fn bit_test(bits: &[u64], i: u32) -> bool {
    bits.get((i / 64) as usize)
        .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
}

/// Dense numbers of the nodes of one capture's graph: the backend's
/// ([`GraphCapture::node_index`]) when it has them, else the engine's own.
struct Numbering<N> {
    /// `Some(true)`: the backend numbers nodes; `Some(false)`: the engine
    /// does; `None`: no node seen yet.
    backend: Option<bool>,
    /// The engine's numbers (backends without `node_index`).
    interned: FastMap<N, u32>,
    /// Engine numbers: the node of each number.
    nodes: Vec<N>,
    /// Engine numbers: each node's dependencies, once asked for, as a
    /// (start, length) range of `dep_numbers`. Every stream's walk of the
    /// capture shares them, so the backend is asked once per node and
    /// capture, not once per node and stream. (Stream capture never changes
    /// a node's dependencies once it is in the graph; an edge a program adds
    /// by hand later is missed, which can only withhold a reuse.)
    deps: Vec<Option<(u32, u32)>>,
    /// The numbers `deps` ranges point into.
    dep_numbers: Vec<u32>,
    /// The backend numbered some nodes and not others: no visited set is
    /// trusted any more (every check answers "not visited").
    broken: bool,
}

impl<N: Copy + Eq + std::hash::Hash> Numbering<N> {
    /// The number of `node`, numbering it if new; `None` when it cannot be
    /// numbered (then it is never counted as visited).
    #[inline]
    fn number<S, C: GraphCapture<S, Node = N>>(
        &mut self,
        backend: &C,
        capture: u64,
        node: N,
    ) -> Option<u32> {
        match (backend.node_index(capture, node), self.backend) {
            (Some(i), None | Some(true)) if i < MAX_NODE_NUMBER => {
                self.backend = Some(true);
                Some(i)
            }
            (None, None | Some(false)) => {
                self.backend = Some(false);
                let next = self.interned.len() as u32;
                let (nodes, deps) = (&mut self.nodes, &mut self.deps);
                Some(*self.interned.entry(node).or_insert_with(|| {
                    nodes.push(node);
                    deps.push(None);
                    next
                }))
            }
            _ => {
                self.broken = true;
                None
            }
        }
    }

    /// The number of `node` if it has one.
    #[inline]
    fn find<S, C: GraphCapture<S, Node = N>>(
        &self,
        backend: &C,
        capture: u64,
        node: N,
    ) -> Option<u32> {
        if self.broken {
            return None;
        }
        match self.backend {
            Some(true) => backend
                .node_index(capture, node)
                .filter(|&i| i < MAX_NODE_NUMBER),
            Some(false) => self.interned.get(&node).copied(),
            None => None,
        }
    }
}

/// The visited sets of one capture: for each stream, the graph nodes known
/// to precede its future work (ancestors-or-self of every terminal it has
/// had when walked), as bitsets over a dense numbering of the nodes.
pub(crate) struct Reach<S, N> {
    num: Numbering<N>,
    streams: Vec<(S, Vec<u64>)>,
    /// The walks' buffers: numbers to expand (engine numbers), nodes to
    /// expand (backend numbers), and one node's dependencies as the backend
    /// gives them.
    stack: Vec<u32>,
    nodes: Vec<N>,
    fetched: Vec<N>,
}

impl<S, N> Default for Reach<S, N> {
    fn default() -> Self {
        Self {
            num: Numbering {
                backend: None,
                interned: FastMap::default(),
                nodes: Vec::new(),
                deps: Vec::new(),
                dep_numbers: Vec::new(),
                broken: false,
            },
            streams: Vec::new(),
            stack: Vec::new(),
            nodes: Vec::new(),
            fetched: Vec::new(),
        }
    }
}

impl<S: Copy + Eq, N: Copy + Eq + std::hash::Hash> Reach<S, N> {
    /// The visited bitset of `stream`, if it has one.
    #[inline]
    fn bits(&self, stream: S) -> Option<&[u64]> {
        self.streams
            .iter()
            .find(|(s, _)| *s == stream)
            .map(|(_, b)| b.as_slice())
    }

    /// Whether every node of `nodes` is in `stream`'s visited set.
    fn all_visited<C: GraphCapture<S, Node = N>>(
        &self,
        backend: &C,
        capture: u64,
        stream: S,
        nodes: &[N],
    ) -> bool {
        let Some(bits) = self.bits(stream) else {
            return false;
        };
        nodes.iter().all(|&n| {
            self.num
                .find(backend, capture, n)
                .is_some_and(|i| bit_test(bits, i))
        })
    }

    /// Adds the ancestors-or-self of `terminals` to `stream`'s visited set
    /// (incremental reverse walk: a visited node is never expanded again).
    /// With the backend's numbers the backend marks the bitset itself
    /// ([`GraphCapture::mark_ancestors`]) when it can; otherwise the engine
    /// walks, one [`GraphCapture::extend_node_dependencies`] call per node
    /// expanded (with engine numbers, once per node and capture).
    fn visit<C: GraphCapture<S, Node = N>>(
        &mut self,
        backend: &C,
        capture: u64,
        stream: S,
        terminals: &[N],
    ) -> Result<(), Error> {
        let slot = match self.streams.iter().position(|(s, _)| *s == stream) {
            Some(i) => i,
            None => {
                self.streams.push((stream, Vec::new()));
                self.streams.len() - 1
            }
        };
        if self.num.backend.is_none()
            && let Some(&t) = terminals.first()
        {
            // The first node tells whether the backend numbers nodes.
            self.num.number(backend, capture, t);
        }
        let num = &mut self.num;
        let bits = &mut self.streams[slot].1;
        if num.backend == Some(true)
            && !num.broken
            && backend.mark_ancestors(capture, terminals, bits)?
        {
            return Ok(());
        }
        if num.backend == Some(true) && !num.broken {
            // The backend numbers nodes (known from an earlier node) but
            // could not mark these: walk here with its numbers.
            let mut broken = false;
            let r = walk_numbered(
                backend,
                capture,
                bits,
                terminals,
                &mut self.nodes,
                &mut self.fetched,
                &mut broken,
            );
            num.broken |= broken;
            r?;
        } else {
            // The engine numbers nodes: walk here, asking the backend for a
            // node's dependencies only the first time any stream expands it.
            walk_interned(
                backend,
                capture,
                num,
                bits,
                terminals,
                &mut self.stack,
                &mut self.fetched,
            )?;
        }
        Ok(())
    }
}

/// The reverse walk over the backend's node numbers (see [`Reach::visit`]):
/// marks in `bits` the ancestors-or-self of `terminals`; a node the backend
/// does not number sets `broken` and is not expanded.
fn walk_numbered<S, C: GraphCapture<S>>(
    backend: &C,
    capture: u64,
    bits: &mut Vec<u64>,
    terminals: &[C::Node],
    stack: &mut Vec<C::Node>,
    fetched: &mut Vec<C::Node>,
    broken: &mut bool,
) -> Result<(), Error> {
    let mut visit = |n: C::Node| match backend.node_index(capture, n) {
        Some(i) if i < MAX_NODE_NUMBER => bit_set(bits, i),
        _ => {
            *broken = true;
            false
        }
    };
    stack.clear();
    stack.extend(terminals.iter().copied().filter(|&n| visit(n)));
    while let Some(n) = stack.pop() {
        fetched.clear();
        backend.extend_node_dependencies(n, fetched)?;
        for &d in fetched.iter() {
            if visit(d) {
                stack.push(d);
            }
        }
    }
    Ok(())
}

/// The reverse walk over engine numbers (see [`Reach::visit`]): marks in
/// `bits` the ancestors-or-self of `terminals`, expanding each newly marked
/// node through `num`'s dependency cache.
fn walk_interned<S, C: GraphCapture<S>>(
    backend: &C,
    capture: u64,
    num: &mut Numbering<C::Node>,
    bits: &mut Vec<u64>,
    terminals: &[C::Node],
    stack: &mut Vec<u32>,
    fetched: &mut Vec<C::Node>,
) -> Result<(), Error> {
    stack.clear();
    for &t in terminals {
        if let Some(i) = num.number(backend, capture, t)
            && bit_set(bits, i)
        {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        let (start, len) = match num.deps[i as usize] {
            Some(r) => r,
            None => {
                fetched.clear();
                backend.extend_node_dependencies(num.nodes[i as usize], fetched)?;
                let start = num.dep_numbers.len() as u32;
                for &d in fetched.iter() {
                    if let Some(j) = num.number(backend, capture, d) {
                        num.dep_numbers.push(j);
                    }
                }
                let r = (start, num.dep_numbers.len() as u32 - start);
                num.deps[i as usize] = Some(r);
                r
            }
        };
        for k in start..start + len {
            let d = num.dep_numbers[k as usize];
            if bit_set(bits, d) {
                stack.push(d);
            }
        }
    }
    Ok(())
}

/// Per-stream state of the reclaim step: deferred blocks with markers
/// pushed so far, and the terminals and that count at the last check
/// (nothing changed = nothing new to reclaim).
struct StreamCheck<N> {
    pushes: u64,
    checked: Option<(Vec<N>, u64)>,
}

impl<N> Default for StreamCheck<N> {
    fn default() -> Self {
        Self {
            pushes: 0,
            checked: None,
        }
    }
}

/// `cross_stream` bookkeeping of one capture: terminal snapshots of the
/// streams at the moments memory became free, and which snapshot last
/// covered each freed byte range.
pub(crate) struct CrossLog<S, N> {
    /// Per stream, its terminal sets at free moments, oldest first (a
    /// stream's frontier only moves forward, so a later snapshot's ancestors
    /// include an earlier one's).
    snaps: FastMap<S, Vec<(u32, u32)>>,
    /// The snapshots' nodes: `snaps` holds (start, length) ranges of it.
    snap_nodes: Vec<N>,
    /// Disjoint freed ranges: start → (end, freeing stream, snapshot index).
    ranges: BTreeMap<u64, (u64, S, u32)>,
    /// (requesting stream, freeing stream) → number of the freeing stream's
    /// snapshots known to lie in the requesting stream's visited set.
    known: FastMap<(S, S), u32>,
    /// A free could not be logged: no free block moves across streams in
    /// this capture any more.
    poisoned: bool,
    /// The reclaim step's state, per allocation stream.
    checks: FastMap<S, StreamCheck<N>>,
    /// `log_range`'s buffer of range starts to remove.
    inside: Vec<u64>,
}

impl<S, N> Default for CrossLog<S, N> {
    fn default() -> Self {
        Self {
            snaps: FastMap::default(),
            snap_nodes: Vec::new(),
            ranges: BTreeMap::new(),
            known: FastMap::default(),
            poisoned: false,
            checks: FastMap::default(),
            inside: Vec::new(),
        }
    }
}

impl<S: Copy + Eq + std::hash::Hash, N: Copy + Eq> CrossLog<S, N> {
    /// The index of `stream`'s snapshot equal to `terminals` (appended if new).
    fn snapshot(&mut self, stream: S, terminals: &[N]) -> u32 {
        let v = self.snaps.entry(stream).or_default();
        let same = v.last().is_some_and(|&(at, len)| {
            let l = &self.snap_nodes[at as usize..(at + len) as usize];
            l.len() == terminals.len() && terminals.iter().all(|t| l.contains(t))
        });
        if !same {
            v.push((self.snap_nodes.len() as u32, terminals.len() as u32));
            self.snap_nodes.extend_from_slice(terminals);
        }
        (v.len() - 1) as u32
    }

    /// Logs `[lo, hi)` as freed by `stream` whose terminals are `terminals`.
    fn log_free(&mut self, lo: u64, hi: u64, stream: S, terminals: &[N]) {
        let idx = self.snapshot(stream, terminals);
        self.log_range(lo, hi, stream, idx);
    }

    /// Logs `[lo, hi)` as freed by `stream` at snapshot `idx`, replacing what
    /// was logged over those bytes. One backward walk over the ranges that
    /// end after `lo` finds everything to change: a range straddling `lo` is
    /// truncated in place, one starting at `lo` is overwritten in place, the
    /// others starting inside are removed, and the part of any range past
    /// `hi` is kept from `hi` on.
    fn log_range(&mut self, lo: u64, hi: u64, stream: S, idx: u32) {
        let mut right: Option<(u64, S, u32)> = None;
        let mut at_lo = false;
        let mut inside = std::mem::take(&mut self.inside);
        inside.clear();
        for (&k, v) in self.ranges.range_mut(..hi).rev() {
            if v.0 <= lo {
                break;
            }
            if v.0 > hi {
                right = Some(*v);
            }
            if k < lo {
                v.0 = lo;
                break;
            }
            if k == lo {
                *v = (hi, stream, idx);
                at_lo = true;
            } else {
                inside.push(k);
            }
        }
        for &k in &inside {
            self.ranges.remove(&k);
        }
        self.inside = inside;
        if !at_lo {
            self.ranges.insert(lo, (hi, stream, idx));
        }
        if let Some(r) = right {
            self.ranges.insert(hi, r);
        }
    }

    /// The (stream, snapshot) entries logged over `[lo, hi)`.
    #[cfg(test)]
    fn entries(&self, lo: u64, hi: u64) -> Vec<(S, u32)> {
        let mut v = Vec::new();
        if let Some((_, &(e, st, ix))) = self.ranges.range(..lo).next_back()
            && e > lo
        {
            v.push((st, ix));
        }
        for (_, &(_, st, ix)) in self.ranges.range(lo..hi) {
            v.push((st, ix));
        }
        v
    }
}

/// Buffers the capture paths reuse, so that no operation allocates for a
/// backend query.
pub(crate) struct CaptureScratch<S, N> {
    /// What the reclaim step of the current malloc learned of its stream:
    /// (stream, capture, whether its visited set covers `terminals`). Reset
    /// at every reclaim step; `cross_stream_reuse`, later in the same
    /// malloc, uses it instead of asking the backend again.
    current: Option<(S, u64, bool)>,
    /// The capture status and id the reclaim step of the current malloc
    /// got for its stream; the pool choice uses it instead of a second query.
    pub(crate) queried: Option<(S, CaptureStatus, u64)>,
    /// The cross-stream search's buffers: each stream's next candidate
    /// (size, address, stream, block), the blocks held out of the free set,
    /// and which streams capture here.
    heads: Vec<(u64, u64, S, BlockId)>,
    held: Vec<(S, u64, u64, BlockId, Option<u64>)>,
    member: Vec<(S, bool)>,
    /// Terminals of the stream a malloc runs on.
    terminals: Vec<N>,
    /// Terminals of any other stream queried (free markers, logged frees,
    /// capture membership, the pool choice).
    pub(crate) other: Vec<N>,
}

impl<S, N> Default for CaptureScratch<S, N> {
    fn default() -> Self {
        Self {
            current: None,
            queried: None,
            heads: Vec::new(),
            held: Vec::new(),
            member: Vec::new(),
            terminals: Vec::new(),
            other: Vec::new(),
        }
    }
}

impl<B: Backend> Inner<B> {
    /// Free markers of a block freed during capture; empty = wait for the
    /// capture's end. Never fails: any doubt gives the safe empty list.
    pub(crate) fn free_markers(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<Vec<NodeOf<B>>, Error> {
        let b = &self.blocks[id as usize];
        // Uses recorded before the capture are eager work the graph does not
        // order: those blocks wait for capture end and their events (PyTorch
        // would take the terminals of those streams if they capture now).
        if !b.stream_uses.is_empty() {
            return Ok(Vec::new());
        }
        let uses = 1 + b.capture_uses.len();
        let buf = &mut self.capture_scratch.other;
        let mut markers: Vec<NodeOf<B>> = Vec::new();
        let mut capture_id = None;
        for k in 0..uses {
            let b = &self.blocks[id as usize];
            let s = if k == 0 {
                b.stream
            } else {
                b.capture_uses[k - 1]
            };
            let (status, cid) = match capture_state(backend, s, buf) {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(%e, "capture_info failed while recording free markers");
                    return Ok(Vec::new());
                }
            };
            if status != CaptureStatus::Active {
                return Ok(Vec::new());
            }
            if *capture_id.get_or_insert(cid) != cid {
                return Ok(Vec::new());
            }
            for &n in buf.iter() {
                if !markers.contains(&n) {
                    markers.push(n);
                }
            }
        }
        // The caller defers the block with these markers: the reclaim step
        // of its stream has something new to look at.
        let stream = self.blocks[id as usize].stream;
        if let Some(c) = capture_id
            && self.ensure_context(backend, stream, c)?
            && let Some(ctx) = self.reuse_contexts.get_mut(&c)
        {
            ctx.cross.checks.entry(stream).or_default().pushes += 1;
        }
        Ok(markers)
    }

    /// Makes sure a reuse context exists for capture `capture`, which
    /// `stream` captures into; false when no registered pool matches.
    fn ensure_context(
        &mut self,
        backend: &B,
        stream: B::Stream,
        capture: u64,
    ) -> Result<bool, Error> {
        if self.reuse_contexts.contains_key(&capture) {
            return Ok(true);
        }
        // A `CaptureOf` entry learns its capture id at the first allocation
        // routed to it; a block freed in capture before any allocation (a
        // default-pool block) must not wait for that.
        for ci in 0..self.captures.len() {
            if let PoolFilter::CaptureOf(origin) = self.captures[ci].filter
                && self.captures[ci].resolved.is_none()
            {
                if let Some(id) = active_capture_id(backend, origin)? {
                    self.captures[ci].resolved = Some(id);
                }
            }
        }
        let mut pool = None;
        for c in self.captures.iter().rev() {
            let hit = match &c.filter {
                PoolFilter::Streams(v) => v.contains(&stream),
                PoolFilter::CaptureId(id) => *id == capture,
                PoolFilter::CaptureOf(_) => c.resolved == Some(capture),
            };
            if hit {
                pool = Some(c.pool);
                break;
            }
        }
        let Some(pool) = pool else { return Ok(false) };
        self.reuse_contexts.insert(
            capture,
            ReuseContext {
                visited: Default::default(),
                pool,
                cross: CrossLog::default(),
            },
        );
        Ok(true)
    }

    /// Extends the requesting stream's visited set; returns the capture id
    /// (the stream's current terminals are left in `capture_scratch`), or
    /// `None` when the stream is not capturing into a registered pool.
    fn extend_visited(&mut self, backend: &B, stream: B::Stream) -> Result<Option<u64>, Error> {
        if let Some((s, capture, walked)) = self.capture_scratch.current.take()
            && s == stream
        {
            // The reclaim step of this malloc asked already (and the
            // context exists); walk unless it did.
            if !walked && let Some(ctx) = self.reuse_contexts.get_mut(&capture) {
                ctx.visited.visit(
                    graph(backend)?,
                    capture,
                    stream,
                    &self.capture_scratch.terminals,
                )?;
            }
            return Ok(Some(capture));
        }
        let (status, capture) =
            capture_state(backend, stream, &mut self.capture_scratch.terminals)?;
        if status != CaptureStatus::Active || self.capture_scratch.terminals.is_empty() {
            return Ok(None);
        }
        if !self.ensure_context(backend, stream, capture)? {
            return Ok(None);
        }
        if let Some(ctx) = self.reuse_contexts.get_mut(&capture) {
            ctx.visited.visit(
                graph(backend)?,
                capture,
                stream,
                &self.capture_scratch.terminals,
            )?;
        }
        Ok(Some(capture))
    }

    fn markers_visited(
        &self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        markers: &[NodeOf<B>],
    ) -> bool {
        let Some(cap) = backend.capture() else {
            return false;
        };
        self.reuse_contexts
            .get(&capture)
            .is_some_and(|c| c.visited.all_visited(cap, capture, stream, markers))
    }

    /// `cross_stream` mode: logs the free block `id` (just freed and merged)
    /// as freed by its stream now. Called for every block that becomes free
    /// during a capture.
    pub(crate) fn note_capture_free(&mut self, backend: &B, id: BlockId) {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream
            || self.captures.is_empty()
        {
            return;
        }
        let b = &self.blocks[id as usize];
        let (stream, lo, hi) = (b.stream, b.addr, b.addr + b.size);
        let (status, capture) = match capture_state(
            backend,
            stream,
            &mut self.capture_scratch.other,
        ) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(%e, "capture_info failed; cross-stream reuse of free blocks stops");
                for c in self.reuse_contexts.values_mut() {
                    c.cross.poisoned = true;
                }
                return;
            }
        };
        if status != CaptureStatus::Active {
            return;
        }
        match self.ensure_context(backend, stream, capture) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(%e, "capture_info failed; cross-stream reuse of free blocks stops");
                for c in self.reuse_contexts.values_mut() {
                    c.cross.poisoned = true;
                }
                return;
            }
        }
        self.reuse_contexts
            .get_mut(&capture)
            .expect("ensured above")
            .cross
            .log_free(lo, hi, stream, &self.capture_scratch.other);
    }

    /// Whether every snapshot logged over `[lo, hi)` is in `stream`'s
    /// visited set (capture `capture`).
    fn range_visited(
        &mut self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        lo: u64,
        hi: u64,
    ) -> bool {
        let (Some(cap), Some(ctx)) = (backend.capture(), self.reuse_contexts.get_mut(&capture))
        else {
            return false;
        };
        let visited = &ctx.visited;
        let log = &mut ctx.cross;
        // The ranges over `[lo, hi)`: those starting below `hi` and ending
        // after `lo`, walked down from `hi`.
        for (_, &(end, s, ix)) in log.ranges.range(..hi).rev() {
            if end <= lo {
                break;
            }
            let known = log.known.get(&(stream, s)).copied().unwrap_or(0);
            if ix < known {
                continue;
            }
            let Some(&(at, len)) = log.snaps.get(&s).and_then(|v| v.get(ix as usize)) else {
                return false;
            };
            let snap = &log.snap_nodes[at as usize..(at + len) as usize];
            if !visited.all_visited(cap, capture, stream, snap) {
                return false;
            }
            log.known.insert((stream, s), ix + 1);
        }
        true
    }

    /// Whether free blocks of pool `pool` may move between the streams of
    /// capture `capture`: the capture's free log is intact, `pool` is the
    /// capture's pool, and no stream-filtered (eager, unlogged) allocation
    /// shares it.
    fn free_blocks_may_move(&self, capture: u64, pool: PoolIdx) -> bool {
        self.reuse_contexts.get(&capture).is_some_and(|ctx| {
            !ctx.cross.poisoned
                && self.pool_index.get(&ctx.pool) == Some(&pool)
                && !self
                    .captures
                    .iter()
                    .any(|c| c.pool == ctx.pool && matches!(c.filter, PoolFilter::Streams(_)))
        })
    }

    /// Whether `stream` captures into capture `capture` (answers cached in
    /// `member` for one search).
    fn in_capture(
        &mut self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        member: &mut Vec<(B::Stream, bool)>,
    ) -> Result<bool, Error> {
        if let Some(m) = member.iter().find(|m| m.0 == stream) {
            return Ok(m.1);
        }
        let (status, id) = self.capture_status(backend, stream)?;
        let ok = status == CaptureStatus::Active && id == capture;
        member.push((stream, ok));
        Ok(ok)
    }

    /// The reclaim step at `malloc` during capture (spec 1.5): deferred blocks
    /// of the requesting stream whose markers are all visited are freed.
    pub(crate) fn reclaim_in_capture(
        &mut self,
        backend: &B,
        stream: B::Stream,
    ) -> Result<(), Error> {
        self.capture_scratch.current = None;
        if !self
            .deferred
            .iter()
            .any(|d| d.stream == stream && !d.markers.is_empty())
        {
            // Nothing to reclaim for this stream. Skipping the visited-set
            // extension is sound: a stream's terminals only move forward, so
            // a later extension covers this moment's ancestors too.
            return Ok(());
        }
        let (status, capture) =
            capture_state(backend, stream, &mut self.capture_scratch.terminals)?;
        self.capture_scratch.queried = Some((stream, status, capture));
        if status != CaptureStatus::Active || self.capture_scratch.terminals.is_empty() {
            return Ok(());
        }
        if !self.ensure_context(backend, stream, capture)? {
            return Ok(());
        }
        self.capture_scratch.current = Some((stream, capture, false));
        // Nothing new since the last check (same terminals, no block
        // deferred since): nothing can have become reclaimable (and the
        // visited set covers these terminals).
        let terminals = &self.capture_scratch.terminals;
        let ctx = self
            .reuse_contexts
            .get_mut(&capture)
            .expect("ensured above");
        let check = ctx.cross.checks.entry(stream).or_default();
        let pushes = check.pushes;
        let same = check.checked.as_ref().is_some_and(|(t, _)| t == terminals);
        if same && check.checked.as_ref().is_some_and(|&(_, p)| p == pushes) {
            self.capture_scratch.current = Some((stream, capture, true));
            return Ok(());
        }
        // Same terminals as at the last check: the visited set covers them.
        if !same {
            ctx.visited
                .visit(graph(backend)?, capture, stream, terminals)?;
        }
        self.capture_scratch.current = Some((stream, capture, true));
        match &mut check.checked {
            Some((t, p)) => {
                t.clone_from(terminals);
                *p = pushes;
            }
            None => check.checked = Some((terminals.clone(), pushes)),
        }
        // Free every reclaimable deferred block, in the order of a scan that
        // swap-removes each (the element moved into a freed slot is looked
        // at next). Freeing a block changes no other deferred block's
        // eligibility.
        let cap = graph(backend)?;
        let mut i = 0;
        while let Some(ctx) = self.reuse_contexts.get(&capture) {
            let (deferred, blocks) = (&self.deferred, &self.blocks);
            let found = (i..deferred.len()).find(|&j| {
                let d = &deferred[j];
                d.stream == stream
                    && !d.markers.is_empty()
                    && {
                        let b = &blocks[d.block as usize];
                        debug_assert_eq!(b.stream, d.stream);
                        b.state == BState::Pending && b.stream_uses.is_empty() && b.event_count == 0
                    }
                    && ctx.visited.all_visited(cap, capture, stream, &d.markers)
            });
            let Some(j) = found else { break };
            i = j;
            let id = self.deferred.swap_remove(i).block;
            self.blocks[id as usize].capture_uses.clear();
            self.adopt_free_neighbours(backend, id)?;
            let id = self.free_block(id);
            // As `note_capture_free`, with the terminals just asked for.
            if self.config.graph_capture_record_stream_reuse == CaptureReuse::CrossStream {
                let b = &self.blocks[id as usize];
                let (lo, hi) = (b.addr, b.addr + b.size);
                self.reuse_contexts
                    .get_mut(&capture)
                    .expect("ensured above")
                    .cross
                    .log_free(lo, hi, stream, &self.capture_scratch.terminals);
            }
        }
        Ok(())
    }

    /// `cross_stream` mode, before block `id` (of stream T, about to be
    /// freed during capture) merges with its neighbours: a free neighbour
    /// cached under another stream joins T's free set when every free logged
    /// over its bytes is in T's visited set (T's later work is ordered after
    /// all of that memory's captured uses), so the two merge instead of
    /// leaving the segment cut at a stream boundary.
    pub(crate) fn adopt_free_neighbours(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream {
            return Ok(());
        }
        let b = &self.blocks[id as usize];
        let t = b.stream;
        let nbs = [b.prev, b.next];
        let cand = |blocks: &[crate::engine::state::Block<B::Stream>], n: BlockId| {
            n != crate::engine::state::NIL && {
                let nb = &blocks[n as usize];
                nb.state == BState::Free && nb.stream != t
            }
        };
        if !nbs.iter().any(|&n| cand(&self.blocks, n)) {
            return Ok(());
        }
        // Ask afresh (a free outside malloc must not use the cached query of
        // an earlier malloc).
        self.capture_scratch.current = None;
        let Some(capture) = self.extend_visited(backend, t)? else {
            return Ok(());
        };
        if !self.free_blocks_may_move(capture, self.blocks[id as usize].pool) {
            return Ok(());
        }
        let mut member = std::mem::take(&mut self.capture_scratch.member);
        member.clear();
        for n in nbs {
            if !cand(&self.blocks, n) {
                continue;
            }
            let (s, lo, hi) = {
                let nb = &self.blocks[n as usize];
                (nb.stream, nb.addr, nb.addr + nb.size)
            };
            // a failed query only means no adoption
            let in_capture = self
                .in_capture(backend, capture, s, &mut member)
                .unwrap_or(false);
            if in_capture && self.range_visited(backend, capture, t, lo, hi) {
                self.remove_free(n);
                self.blocks[n as usize].stream = t;
                self.insert_free(n);
            }
        }
        self.capture_scratch.member = member;
        Ok(())
    }

    /// `cross_stream` mode: after the normal search missed, hand the
    /// requesting stream the best-fitting (size, then address) block among
    /// the deferred blocks of other streams whose markers are all in its
    /// visited set and the free blocks of other streams of the capture whose
    /// logged frees all are. The block changes stream; it never merges with
    /// blocks of other streams.
    pub(crate) fn cross_stream_reuse(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream {
            return Ok(None);
        }
        let Some(capture) = self.extend_visited(backend, p.stream)? else {
            return Ok(None);
        };
        let max_split = self.config.max_split_size;
        let max_nsr = self.config.max_non_split_rounding_size;
        let fits = |size: u64| {
            size >= p.size
                && !(p.size < max_split && size >= max_split)
                && !(p.size >= max_split && size >= p.size.saturating_add(max_nsr))
        };
        // 1. deferred blocks of other streams
        let mut best: Option<(u64, u64, usize)> = None;
        for (i, d) in self.deferred.iter().enumerate() {
            let b = &self.blocks[d.block as usize];
            if d.markers.is_empty()
                || b.stream == p.stream
                || b.pool != p.pool
                || b.small != p.small
                || !fits(b.size)
                || b.state != BState::Pending
                || !b.stream_uses.is_empty()
                || b.event_count != 0
            {
                continue;
            }
            if best.is_some_and(|bk| (bk.0, bk.1) <= (b.size, b.addr)) {
                continue;
            }
            if self.markers_visited(backend, capture, p.stream, &d.markers) {
                best = Some((b.size, b.addr, i));
            }
        }
        // 2. free blocks of other streams of this capture
        let mut free_best: Option<BlockId> = None;
        if self.free_blocks_may_move(capture, p.pool) {
            // The candidates are the fitting free blocks of other streams in
            // (size, address) order; the first whose stream captures here and
            // whose logged frees are all visited wins. They are visited in
            // that order by merging the streams: each stream's next block is
            // its first fitting one once the blocks already looked at are
            // held out of the free set (they go back before returning). A
            // stream outside the capture drops out whole.
            let pool = self.pools[p.pool as usize]
                .as_ref()
                .expect("live pool")
                .get_ref(p.small);
            let mut heads = std::mem::take(&mut self.capture_scratch.heads);
            let mut held = std::mem::take(&mut self.capture_scratch.held);
            let mut member = std::mem::take(&mut self.capture_scratch.member);
            heads.clear();
            held.clear();
            member.clear();
            heads.extend(
                pool.free
                    .streams()
                    .filter(|&s| s != p.stream)
                    .filter_map(|s| {
                        let (size, addr, id) = pool.free.first_at_least(s, p.size)?;
                        fits(size).then_some((size, addr, s, id))
                    }),
            );
            let mut found = Ok(None);
            while let Some(h) = (0..heads.len()).min_by_key(|&i| (heads[i].0, heads[i].1)) {
                let (size, addr, s, id) = heads[h];
                if best.is_some_and(|bk| (bk.0, bk.1) <= (size, addr)) {
                    break;
                }
                match self.in_capture(backend, capture, s, &mut member) {
                    Err(e) => {
                        found = Err(e);
                        break;
                    }
                    Ok(false) => {
                        heads.swap_remove(h);
                        continue;
                    }
                    Ok(true) => {}
                }
                if self.range_visited(backend, capture, p.stream, addr, addr + size) {
                    found = Ok(Some(id));
                    break;
                }
                let wk = self.blocks[id as usize].dormant_key();
                let free = &mut self.pool_mut(p.pool).get(p.small).free;
                let removed = free.remove(s, size, addr, wk);
                debug_assert_eq!(removed, Some(id));
                held.push((s, size, addr, id, wk));
                match free.first_at_least(s, size) {
                    Some((size, addr, id)) if fits(size) => heads[h] = (size, addr, s, id),
                    _ => {
                        heads.swap_remove(h);
                    }
                }
            }
            let free = &mut self.pool_mut(p.pool).get(p.small).free;
            for &(s, size, addr, id, wk) in &held {
                free.insert(s, size, addr, id, wk);
            }
            self.capture_scratch.heads = heads;
            self.capture_scratch.held = held;
            self.capture_scratch.member = member;
            free_best = found?;
        }
        let id = if let Some(id) = free_best {
            self.remove_free(id);
            self.blocks[id as usize].stream = p.stream;
            id
        } else if let Some((_, _, i)) = best {
            let id = self.deferred.swap_remove(i).block;
            // Retire the block as if freed (stats), re-keyed to the new
            // stream: it merges only with free blocks of that stream.
            let b = &mut self.blocks[id as usize];
            b.capture_uses.clear();
            let (from, pool, small) = (b.stream, b.pool, b.small);
            b.stream = p.stream;
            // the block is out: count it under its new stream
            let free = &mut self.pool_mut(pool).get(small).free;
            free.note_back_only(from);
            free.note_out(p.stream);
            let id = self.free_block(id);
            self.remove_free(id);
            id
        } else {
            return Ok(None);
        };
        // Whatever of the block stays free (a split remainder) is ordered
        // before the new stream's current terminals: log it so.
        let (lo, hi) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.addr + b.size)
        };
        if let Some(ctx) = self.reuse_contexts.get_mut(&capture) {
            ctx.cross
                .log_free(lo, hi, p.stream, &self.capture_scratch.terminals);
        }
        Ok(Some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::CrossLog;

    /// The straightforward interval overwrite `log_range` must match.
    fn reference_log(
        m: &mut std::collections::BTreeMap<u64, (u64, u32, u32)>,
        lo: u64,
        hi: u64,
        v: (u32, u32),
    ) {
        if let Some((&s, &(e, st, ix))) = m.range(..lo).next_back()
            && e > lo
        {
            m.insert(s, (lo, st, ix));
            if e > hi {
                m.insert(hi, (e, st, ix));
            }
        }
        let inside: Vec<u64> = m.range(lo..hi).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some((e, st, ix)) = m.remove(&k)
                && e > hi
            {
                m.insert(hi, (e, st, ix));
            }
        }
        m.insert(lo, (hi, v.0, v.1));
    }

    #[test]
    fn log_range_matches_the_reference_overwrite() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..50 {
            let mut l: CrossLog<u32, u32> = CrossLog::default();
            let mut r = std::collections::BTreeMap::new();
            for i in 0..400u32 {
                let lo = next(200);
                let hi = lo + 1 + next(40);
                let st = next(4) as u32;
                l.log_range(lo, hi, st, i);
                reference_log(&mut r, lo, hi, (st, i));
                assert_eq!(l.ranges, r);
            }
        }
    }

    #[test]
    fn log_ranges_stay_disjoint_and_newest_wins() {
        let mut l: CrossLog<u32, u32> = CrossLog::default();
        let a = l.snapshot(1, &[10]);
        l.log_range(0, 100, 1, a);
        let b = l.snapshot(1, &[11]);
        assert_eq!(l.snapshot(1, &[11]), b);
        l.log_range(20, 40, 1, b);
        assert_eq!(l.entries(0, 10), vec![(1, a)]);
        assert_eq!(l.entries(25, 30), vec![(1, b)]);
        assert_eq!(l.entries(30, 60), vec![(1, b), (1, a)]);
        let c = l.snapshot(2, &[12]);
        l.log_range(10, 120, 2, c);
        assert_eq!(l.entries(0, 200), vec![(1, a), (2, c)]);
        assert_eq!(l.entries(100, 110), vec![(2, c)]);
        assert!(l.entries(120, 130).is_empty());
    }
}
