//! Memory history: a bounded ring buffer of trace entries (PyTorch's
//! `_record_memory_history`), off by default and costing one branch when off.
//!
//! # Contexts
//!
//! A caller attaches an opaque [`HistoryContext`] to the operations of its
//! thread with [`set_current_context`] (the PyTorch drop-in: the Python and
//! C++ stack PyTorch's recorder gathered, outside every allocator lock, as
//! PyTorch's own allocator gathers it). The history keeps it as PyTorch's
//! `DeviceCachingAllocator` keeps its `GatheredContext`s, at the level
//! [`HistoryConfig::record_context`] names ([`RecordContext`]):
//!
//! * an allocation's context stays with its block until the block is back
//!   in its pool (`free_completed`), and with a segment it created until the
//!   segment is released: [`BlockSnapshot::context`] and
//!   [`SegmentSnapshot::context`] (level `State` and above);
//! * trace entries carry the context of the operation that made them, else
//!   (a free, a segment release) the one kept with the block or segment
//!   (level `Alloc` and above).
//!
//! A thread's compile context ([`push_compile_context`]) and user metadata
//! ([`set_user_metadata`]) go into every entry it records, as PyTorch's
//! thread-local `compile_context` stack and `user_metadata`.
//!
//! [`BlockSnapshot::context`]: crate::engine::BlockSnapshot::context
//! [`SegmentSnapshot::context`]: crate::engine::SegmentSnapshot::context

use std::any::Any;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::engine::fast_map::FastMap;
use crate::engine::snapshot::{BlockState, Snapshot};
use crate::engine::state::Inner;
use crate::error::Error;

/// What happened (PyTorch's trace-entry actions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block was handed out.
    Alloc,
    /// The caller freed a block (it may still wait for other streams).
    FreeRequested,
    /// A block actually returned to its pool.
    FreeCompleted,
    /// A device segment was allocated.
    SegmentAlloc,
    /// A device segment was released.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// An allocation failed with out-of-memory (addr = device free bytes).
    Oom,
    /// A snapshot was taken.
    Snapshot,
}

impl TraceAction {
    /// Every action, in PyTorch's `TraceEntry::Action` order.
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// PyTorch's string for the action.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
        }
    }

    /// The action of PyTorch's string (`parseTraceEntryAction`); an
    /// unknown name is [`Error::InvalidArgument`] with PyTorch's message.
    pub fn parse(name: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == name)
            .ok_or_else(|| Error::InvalidArgument(format!("Unknown TraceEntry action: {name}")))
    }

    /// The position in PyTorch's `TraceEntry::Action` enum (alloc 0 … oom 8).
    pub fn code(self) -> u32 {
        Self::ALL.iter().position(|a| *a == self).unwrap_or(0) as u32
    }
}

/// A set of [`TraceAction`]s (`skip_actions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ActionSet(u16);

impl ActionSet {
    /// No action.
    pub const EMPTY: ActionSet = ActionSet(0);

    /// The set with `a` added.
    #[must_use]
    pub fn with(self, a: TraceAction) -> Self {
        Self(self.0 | (1 << a.code()))
    }

    /// Whether `a` is in the set.
    pub fn contains(self, a: TraceAction) -> bool {
        self.0 & (1 << a.code()) != 0
    }

    /// The set of PyTorch's action names; an unknown name is
    /// [`Error::InvalidArgument`] ("Unknown TraceEntry action: ...").
    pub fn parse<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, Error> {
        names
            .into_iter()
            .try_fold(Self::EMPTY, |s, n| Ok(s.with(TraceAction::parse(n)?)))
    }
}

/// Which contexts the history keeps (PyTorch's `RecordContext`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordContext {
    /// None.
    Never,
    /// Those of live blocks and segments (snapshots' `frames`).
    State,
    /// Also in the trace entries of allocations (and of what they caused).
    Alloc,
    /// Also in the entries of frees and segment releases. PyTorch's
    /// default (`context="all"`).
    #[default]
    All,
}

impl RecordContext {
    /// The level of PyTorch's enum value (0 never … 3 all).
    pub fn from_level(level: u32) -> Option<Self> {
        [Self::Never, Self::State, Self::Alloc, Self::All]
            .get(level as usize)
            .copied()
    }
}

/// An opaque context a caller attaches to history entries, blocks and
/// segments (see the module docs): compared by identity.
#[derive(Clone)]
pub struct HistoryContext(Arc<dyn Any + Send + Sync>);

impl HistoryContext {
    /// Wraps `value`; it is dropped when the last entry, block or snapshot
    /// holding it is.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Self(Arc::new(value))
    }

    /// The value, when it is a `T`.
    pub fn downcast_ref<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl PartialEq for HistoryContext {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for HistoryContext {}

impl fmt::Debug for HistoryContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HistoryContext({:p})", Arc::as_ptr(&self.0).cast::<()>())
    }
}

/// One entry of the memory history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Device address (device free bytes for `Oom`).
    pub addr: u64,
    /// Bytes: requested (unrounded) for `Alloc` and the frees, the
    /// segment's or range's for the segment actions, the rounded request
    /// for `Oom`, the active bytes for `Snapshot` (PyTorch's sizes).
    pub size: u64,
    /// Stream (rendered with `Debug`; entries of one stream share it).
    pub stream: Arc<str>,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Captured Rust backtrace, when [`HistoryConfig::backtraces`] is on.
    pub frames: Option<String>,
    /// The caller's context (see the module docs).
    pub context: Option<HistoryContext>,
    /// The recording thread's innermost compile context (PyTorch prints
    /// `"N/A"` for none).
    pub compile_context: Option<Arc<str>>,
    /// The recording thread's user metadata (PyTorch prints `""` for none).
    pub user_metadata: Option<Arc<str>>,
}

/// A `record_function` annotation (PyTorch's `AnnotationEntry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Annotation {
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Key/value pairs (PyTorch's: `name`, `stage`).
    pub metadata: Vec<(String, String)>,
}

/// Settings of the memory history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Ring-buffer capacity (oldest entries are overwritten).
    pub max_entries: usize,
    /// Capture a Rust backtrace for each entry (slow).
    pub backtraces: bool,
    /// Which callers' contexts are kept.
    pub record_context: RecordContext,
    /// Actions not recorded in the ring (PyTorch's `skip_actions`).
    pub skip_actions: ActionSet,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            backtraces: false,
            record_context: RecordContext::All,
            skip_actions: ActionSet::EMPTY,
        }
    }
}

thread_local! {
    static CURRENT: RefCell<Option<HistoryContext>> = const { RefCell::new(None) };
    static COMPILE: RefCell<Vec<Arc<str>>> = const { RefCell::new(Vec::new()) };
    static METADATA: RefCell<Option<Arc<str>>> = const { RefCell::new(None) };
}

/// Sets the context of the calling thread's next operations (`None`: no
/// context) and returns the previous one. Only an allocator whose history
/// is on reads it.
pub fn set_current_context(ctx: Option<HistoryContext>) -> Option<HistoryContext> {
    CURRENT.with(|c| c.replace(ctx))
}

/// Runs `f` with `ctx` as the calling thread's context, restoring the
/// previous one afterwards (also when `f` panics).
pub fn with_context<T>(ctx: Option<HistoryContext>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Option<HistoryContext>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(prev) = self.0.take() {
                set_current_context(prev);
            }
        }
    }
    let _restore = Restore(Some(set_current_context(ctx)));
    f()
}

/// Pushes a compile context (PyTorch: `"Torch-Compiled Region: 0/0"`) on
/// the calling thread's stack; its entries carry the innermost.
pub fn push_compile_context(name: &str) {
    COMPILE.with(|c| c.borrow_mut().push(Arc::from(name)));
}

/// Pops the calling thread's innermost compile context (none: no-op).
pub fn pop_compile_context() {
    COMPILE.with(|c| {
        c.borrow_mut().pop();
    });
}

/// Sets the calling thread's user metadata (`""` clears it), copied into
/// every entry it records.
pub fn set_user_metadata(metadata: &str) {
    let v = (!metadata.is_empty()).then(|| Arc::from(metadata));
    METADATA.with(|m| *m.borrow_mut() = v);
}

/// The calling thread's user metadata (`""` when none).
pub fn user_metadata() -> String {
    METADATA.with(|m| m.borrow().as_deref().unwrap_or("").to_string())
}

/// The `Debug` text of the streams the history has named, shared by their
/// entries: formatting it for every entry cost more than the rest of the
/// entry. Holds at most [`StreamNames::MAX`] (a program that makes a stream
/// per request starts over when it is full).
pub(crate) struct StreamNames<S>(Vec<(S, Arc<str>)>);

impl<S> Default for StreamNames<S> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<S: Copy + Eq + fmt::Debug> StreamNames<S> {
    const MAX: usize = 64;

    /// The name of `s`, formatted once.
    pub fn name(&mut self, s: S) -> Arc<str> {
        if let Some((_, n)) = self.0.iter().find(|(t, _)| *t == s) {
            return n.clone();
        }
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        let n: Arc<str> = format!("{s:?}").into();
        self.0.push((s, n.clone()));
        n
    }
}

impl<B: Backend> Inner<B> {
    /// Appends a history entry when the history is on (one branch when off).
    #[inline]
    pub fn trace(&mut self, action: TraceAction, addr: u64, size: u64, stream: B::Stream) {
        if let Some(h) = self.history.as_mut() {
            h.push(action, addr, size, self.trace_names.name(stream));
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The times of the entries. An entry takes a stamp of the process's clock
/// ([`crate::clock::approximate`]: the TSC where it is usable, unfenced as
/// PyTorch's `getApproximateTime`, a few nanoseconds, kept from going back
/// along the ring; where a read of the system clock costs 32-45 ns on the
/// H200's host and an allocation and its free make three entries); a
/// reading turns stamps into microseconds since the Unix epoch along the
/// line through two (stamp, system time) pairs, the history's start and
/// the reading. Both sources tick at one rate (the invariant TSC, or the
/// monotonic clock's nanoseconds), so the line is exact up to the system
/// clock's own adjustments.
struct EntryClock {
    stamp: u64,
    wall_ns: u128,
}

impl EntryClock {
    fn now() -> Self {
        let wall_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            stamp: crate::clock::stamp(),
            wall_ns,
        }
    }

    /// Microseconds since the Unix epoch of a stamp taken between `self`
    /// (the start) and `to` (the reading).
    fn micros(&self, to: &Self, stamp: u64) -> u64 {
        let ticks = u128::from(to.stamp.saturating_sub(self.stamp));
        let ns = to.wall_ns.saturating_sub(self.wall_ns);
        let after = u128::from(stamp.saturating_sub(self.stamp));
        let off = (after.min(ticks) * ns).checked_div(ticks).unwrap_or(0);
        u64::try_from((self.wall_ns + off) / 1000).unwrap_or(u64::MAX)
    }
}

pub(crate) struct History {
    pub config: HistoryConfig,
    /// The entries, oldest first; in here an entry's `time_us` holds its
    /// clock stamp ([`EntryClock`]), made microseconds when read
    /// ([`History::entries`]).
    ring: VecDeque<TraceEntry>,
    /// The clock at the history's start.
    start: EntryClock,
    /// The stamp of the newest entry.
    last_stamp: u64,
    pub annotations: VecDeque<Annotation>,
    /// The context of each live block's allocation, by address.
    blocks: FastMap<u64, HistoryContext>,
    /// The context of each segment's (mapped range's) allocation and its
    /// size, by start. As PyTorch's `context_when_segment_allocated`, it
    /// lives on the segment's first block: an allocation at the start that
    /// splits that block (smaller than the segment) hands the start to a
    /// new block without it, so the snapshot's segment then has no frames
    /// (the segment-free entry falls back to the free's own context).
    segments: BTreeMap<u64, (HistoryContext, u64)>,
}

impl History {
    pub fn new(config: HistoryConfig) -> Self {
        let start = EntryClock::now();
        Self {
            config,
            ring: VecDeque::with_capacity(config.max_entries.min(1 << 16)),
            last_stamp: start.stamp,
            start,
            annotations: VecDeque::new(),
            blocks: FastMap::default(),
            segments: BTreeMap::new(),
        }
    }

    /// New settings, keeping the entries and contexts (PyTorch keeps its
    /// ring when `_record_memory_history` is called again without
    /// `clear_history`); the oldest entries go past the new capacity.
    pub fn reconfigure(&mut self, config: HistoryConfig) {
        self.config = config;
        while self.ring.len() > config.max_entries {
            self.ring.pop_front();
        }
        while self.annotations.len() > config.max_entries {
            self.annotations.pop_front();
        }
    }

    /// The entries, oldest first, their times in microseconds since the
    /// Unix epoch.
    pub fn entries(&self) -> Vec<TraceEntry> {
        let now = EntryClock::now();
        self.ring
            .iter()
            .map(|e| TraceEntry {
                time_us: self.start.micros(&now, e.time_us),
                ..e.clone()
            })
            .collect()
    }

    /// Drops the entries and annotations (not the contexts of live blocks).
    pub fn clear(&mut self) {
        self.ring.clear();
        self.annotations.clear();
    }

    /// The contexts kept for `action` at `addr` (see the module docs): the
    /// entry's context.
    fn keep_contexts(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        current: Option<HistoryContext>,
    ) -> Option<HistoryContext> {
        let keep = self.config.record_context >= RecordContext::State;
        match action {
            TraceAction::Alloc => {
                match (&current, keep) {
                    (Some(c), true) => self.blocks.insert(addr, c.clone()),
                    _ => self.blocks.remove(&addr),
                };
                if self.segments.get(&addr).is_some_and(|(_, seg)| size < *seg) {
                    self.segments.remove(&addr);
                }
                current
            }
            TraceAction::FreeRequested => current.or_else(|| self.blocks.get(&addr).cloned()),
            TraceAction::FreeCompleted => {
                let kept = self.blocks.remove(&addr);
                current.or(kept)
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                if let (Some(c), true) = (&current, keep) {
                    self.segments.insert(addr, (c.clone(), size));
                }
                current
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                // the contexts of the ranges starting inside [addr, addr + size)
                let mut inside = self.segments.split_off(&addr);
                let mut after = inside.split_off(&addr.saturating_add(size.max(1)));
                self.segments.append(&mut after);
                current.or_else(|| inside.into_values().next().map(|(c, _)| c))
            }
            TraceAction::Oom | TraceAction::Snapshot => current,
        }
    }

    #[cold]
    pub fn push(&mut self, action: TraceAction, addr: u64, size: u64, stream: Arc<str>) {
        let current = CURRENT.with(|c| c.borrow().clone());
        let ctx = self.keep_contexts(action, addr, size, current);
        if self.config.max_entries == 0 || self.config.skip_actions.contains(action) {
            return;
        }
        while self.ring.len() >= self.config.max_entries {
            self.ring.pop_front();
        }
        // unfenced (a few cycles less); the entries' order is the ring's,
        // and their times never go back along it
        self.last_stamp = crate::clock::approximate().max(self.last_stamp);
        let frames = self
            .config
            .backtraces
            .then(|| std::backtrace::Backtrace::force_capture().to_string());
        self.ring.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: self.last_stamp,
            frames,
            context: ctx.filter(|_| self.config.record_context >= RecordContext::Alloc),
            compile_context: COMPILE.with(|c| c.borrow().last().cloned()),
            user_metadata: METADATA.with(|m| m.borrow().clone()),
        });
    }

    /// Appends an annotation (bounded by `max_entries`, as the ring).
    pub fn annotate(&mut self, metadata: Vec<(String, String)>) {
        if self.config.max_entries == 0 {
            return;
        }
        while self.annotations.len() >= self.config.max_entries {
            self.annotations.pop_front();
        }
        self.annotations.push_back(Annotation {
            time_us: now_us(),
            metadata,
        });
    }

    /// Fills the contexts of `snap`'s active blocks and segments, and its
    /// entries and annotations.
    pub fn fill(&self, snap: &mut Snapshot) {
        for seg in &mut snap.segments {
            let end = seg.address.saturating_add(seg.total_size);
            seg.context = self
                .segments
                .range(seg.address..end)
                .next()
                .map(|(_, (c, _))| c.clone());
            for b in &mut seg.blocks {
                if b.state != BlockState::Inactive {
                    b.context = self.blocks.get(&b.address).cloned();
                }
            }
        }
        snap.traces = self.entries();
        snap.annotations = self.annotations.iter().cloned().collect();
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// Turns the memory history on (`Some`) or off (`None`, which drops the
    /// entries and every context). Turned on again while on, it keeps its
    /// entries and contexts under the new settings, as PyTorch does; see
    /// [`Self::clear_memory_history`].
    pub fn record_memory_history(&self, config: Option<HistoryConfig>) {
        let mut g = self.lock();
        match config {
            None => g.history = None,
            Some(c) => {
                if let Some(h) = g.history.as_mut() {
                    h.reconfigure(c);
                } else {
                    g.history = Some(Box::new(History::new(c)));
                }
            }
        }
    }

    /// Drops the history's entries and annotations, keeping it on (PyTorch's
    /// `clear_history=True`).
    pub fn clear_memory_history(&self) {
        if let Some(h) = self.lock().history.as_mut() {
            h.clear();
        }
    }

    /// The settings of the memory history, `None` when it is off.
    pub fn history_config(&self) -> Option<HistoryConfig> {
        self.lock().history.as_ref().map(|h| h.config)
    }

    /// The entries of the memory history, oldest first.
    pub fn memory_history(&self) -> Vec<TraceEntry> {
        self.lock()
            .history
            .as_ref()
            .map_or_else(Vec::new, |h| h.entries())
    }

    /// Records an annotation (PyTorch's `recordAnnotation`, from
    /// `record_function` while the history is on); nothing when it is off.
    pub fn record_annotation(&self, metadata: Vec<(String, String)>) {
        if let Some(h) = self.lock().history.as_mut() {
            h.annotate(metadata);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::StreamNames;
    use std::sync::Arc;

    #[test]
    fn stream_names_are_formatted_once_and_bounded() {
        let mut names = StreamNames::default();
        let a = names.name(7u64);
        let b = names.name(9u64);
        assert_eq!((&*a, &*b), ("7", "9"));
        // the same stream: the same text, not a new one
        assert!(Arc::ptr_eq(&a, &names.name(7)));
        for s in 100..100 + StreamNames::<u64>::MAX as u64 {
            assert_eq!(&*names.name(s), s.to_string());
        }
        assert!(names.0.len() <= StreamNames::<u64>::MAX);
        // started over when full: named again, with the right text
        let again = names.name(7);
        assert_eq!(&*again, "7");
        assert!(!Arc::ptr_eq(&a, &again));
    }
}
