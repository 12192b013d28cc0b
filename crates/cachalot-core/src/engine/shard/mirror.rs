//! Where a solo shard's and one thread's fast operations sum their stat
//! transitions: the shard's own [`Mirror`] and the allocator's one
//! [`SharedMirror`] ([`Logging`] picks, at every check-out).

use super::route::thread_token;
use crate::engine::stat_log::{Rec, Window};
use crate::engine::sync::{AtomicBool, AtomicI64, AtomicU64};

/// Where a shard's fast operations write their stat transitions (set at
/// every check-out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Logging {
    /// This shard is the only one out: no other shard can change a stat,
    /// so its fast operations sum their transitions in
    /// [`Shard::mirror`](super::Shard::mirror) directly, with no log and
    /// no clock.
    Solo,
    /// Several shards are out, and one thread runs their fast operations
    /// (one thread on several streams, as a training loop with a side
    /// stream): it sums their transitions into the allocator's one
    /// [`SharedMirror`], which it owns (claimed by its first fast
    /// operation), with no lock: the owner's operations are ordered by
    /// its own program order, so the sums and peaks are exact, with no
    /// log and no clock. Another thread's fast operation changes nothing
    /// ([`Miss::Thread`](super::Miss::Thread)): the device hands the
    /// mirror over, or, when the owner had run only a few operations since
    /// it claimed it (threads taking turns operation by operation), makes
    /// the shards log from then on (`Inner::multi_thread`).
    Shared,
    /// Several threads run fast operations at once: each appends its
    /// transitions, time-stamped, to its shard's log (`stat_log/`).
    Log,
}

/// A running sum of fast operations' stat transitions (a [`Window`]) and
/// whether it holds any: a solo shard's own
/// ([`Shard::mirror`](super::Shard::mirror)), folded into the device's
/// stats at check-in.
#[derive(Default)]
pub(crate) struct Mirror {
    /// The sums, in the order the transitions happened.
    pub window: Window,
    /// The window changed since it was last folded.
    pub dirty: bool,
}

impl Mirror {
    /// Adds one operation's transitions.
    #[inline(always)]
    pub(super) fn add(&mut self, rec: &Rec) {
        rec.apply(&mut &self.window);
        self.dirty = true;
    }

    /// Folds the sums into `stats` (if any) and empties the window.
    pub(crate) fn fold_into(&mut self, stats: &mut crate::stats::DeviceStats) {
        if std::mem::take(&mut self.dirty) {
            self.window.take_into(stats);
        }
    }
}

/// A turn of a thread on the [`SharedMirror`] (the fast operations it ran
/// from its claim to the next handover) shorter than this is short. (Under
/// the model check, a few: its schedules take both ways.)
pub(crate) const SHORT_TURN: u64 = if cfg!(feature = "shuttle") { 8 } else { 1024 };

/// Short turns in a row after which the threads are taken to run at once,
/// operation by operation: the shards log instead of handing the mirror
/// over. (More than one: a main thread's few operations of setup before
/// its workers start are one short turn.)
pub(crate) const SHORT_TURNS: u32 = 3;

/// The allocator's one mirror for [`Logging::Shared`]: the sums of the
/// fast operations of one thread, its owner, on several shards, written
/// by the owner alone with relaxed loads and stores (no lock, no
/// read-modify-write: the window's numbers, [`Window`]), and folded by the
/// device at check-in.
///
/// Why it is exact: a thread writes here only while it owns the mirror
/// and holds the lock of the shard it operates on; ownership is claimed
/// with a compare-and-swap from "nobody" and given back only by the device
/// ([`Self::reset`]), which holds every shard lock that a fast operation
/// can hold then. So one thread writes between two device passes, in its
/// program order, and each of its writes is ordered before the device's
/// reads by the shard lock it held.
#[derive(Default)]
pub(crate) struct SharedMirror {
    /// The owner's thread token ([`thread_token`]); 0: nobody.
    owner: AtomicU64,
    /// The owner's fast operations since it claimed the mirror.
    ops: AtomicU64,
    /// The sums.
    window: Window<AtomicI64>,
    /// The window changed since it was last folded.
    dirty: AtomicBool,
}

impl SharedMirror {
    /// The mirror, for this thread's fast operation: `None` if another
    /// thread owns it (claimed now if nobody does).
    #[inline(always)]
    pub(super) fn claim(&self) -> Option<&Self> {
        use std::sync::atomic::Ordering::Relaxed;
        let me = thread_token();
        let o = self.owner.load(Relaxed);
        if o == me || (o == 0 && self.owner.compare_exchange(0, me, Relaxed, Relaxed).is_ok()) {
            Some(self)
        } else {
            None
        }
    }

    /// Adds one operation's transitions (by the owner).
    #[inline(always)]
    pub(super) fn add(&self, rec: &Rec) {
        use std::sync::atomic::Ordering::Relaxed;
        rec.apply(&mut &self.window);
        self.ops.store(self.ops.load(Relaxed) + 1, Relaxed);
        self.dirty.store(true, Relaxed);
    }

    /// The owner's fast operations since it claimed the mirror.
    pub(crate) fn ops(&self) -> u64 {
        self.ops.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Folds the sums into `stats` (if any) and empties the window (the
    /// device, holding every shard lock a fast operation can hold).
    pub(crate) fn fold_into(&self, stats: &mut crate::stats::DeviceStats) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.dirty.swap(false, Relaxed) {
            self.window.take_into(stats);
        }
    }

    /// Gives the mirror back to nobody (the device, as for
    /// [`Self::fold_into`]): the next fast operation's thread claims it.
    pub(crate) fn reset(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.owner.store(0, Relaxed);
        self.ops.store(0, Relaxed);
    }
}
