//! The flushed windows of the shards' stat logs: the logs a flush took
//! out ([`Taken`]), and their summaries waiting to be folded in order
//! ([`Folds`]).

use super::{Entry, LOG_CAP, Window};
use crate::engine::shard::SHARDS;
use crate::stats::DeviceStats;

/// The logs a flush swapped out of the shards: per shard, its set-aside
/// log and its log (empty ones where it had none).
pub(crate) type Taken = [[Vec<Entry>; 2]; SHARDS];

/// The flushed windows' summaries waiting to be folded into the device's
/// stats, and the spare logs; behind their own lock
/// (`CachingAllocator::folds`), a leaf: taken alone or with the device lock
/// (and shard locks) held, never before another lock.
///
/// A flush takes the shards' logs out as one window, numbered in the order
/// of the flushes (every entry of a window was logged before any entry of
/// a later one), and summarizes it ([`summarize`](super::summarize))
/// after letting go of every lock, so that flushes on several threads sum
/// their windows in parallel, or hands it to the stats thread
/// (`flusher.rs`). The windows are folded into the stats in their order: a
/// window's peaks start from the values the earlier ones left.
#[derive(Default)]
pub(crate) struct Folds {
    /// Summaries not folded yet, with their window numbers.
    ready: Vec<(u64, Window)>,
    /// Empty logs of [`LOG_CAP`] capacity.
    pub(super) spares: Vec<Vec<Entry>>,
}

impl Folds {
    /// An empty log of `LOG_CAP` capacity (made on the first flushes, then
    /// reused: the fast path never allocates).
    pub(crate) fn spare(&mut self) -> Vec<Entry> {
        self.spares
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(LOG_CAP))
    }

    /// Keeps `logs` (emptied) as spares.
    pub(crate) fn give_back<'a>(&mut self, logs: impl IntoIterator<Item = &'a mut Vec<Entry>>) {
        for log in logs {
            if log.capacity() >= LOG_CAP {
                log.clear();
                self.spares.push(std::mem::take(log));
            }
        }
    }

    /// Files window `n`'s summary.
    pub(crate) fn deposit(&mut self, n: u64, w: Window) {
        self.ready.push((n, w));
    }

    /// Folds the ready windows into `stats` in their order, from window
    /// `*next` on, for as long as the next one is ready; `*next` follows.
    pub(crate) fn fold_ready(&mut self, next: &mut u64, stats: &mut DeviceStats) {
        while let Some(i) = self.ready.iter().position(|(n, _)| *n == *next) {
            let (_, w) = self.ready.swap_remove(i);
            w.fold(stats);
            *next += 1;
        }
    }

    /// Summaries waiting (for the tests).
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.ready.len()
    }
}
