//! The stats thread: sums flushed windows of stat logs off the allocating
//! threads (`docs/design-shards.md`, "The stats thread").
//!
//! A flush swaps the shards' logs out under their locks, then sums the
//! window it took ([`summarize`]): about 1,300 entries at eight threads,
//! read from the other cores' caches, merged in stamp order. Done by the
//! thread whose log filled, that is tens of microseconds of one allocating
//! thread every few dozen. Here the flush hands the window to one
//! process-wide thread instead ([`offer`]), which sums it and files the sum
//! in the allocator's [`Folds`]; the device folds the sums in window order
//! as before, waiting at check-in for any still being summed (the stats
//! thread holds no lock but the `folds` leaf lock, so it always finishes).
//!
//! Off by default ([`set_enabled`]): it takes a core of its own, which
//! pays where allocating threads leave cores idle and costs where they do
//! not (on a 2-core machine, two allocating threads ran 13 Mops/s with it
//! against 17-22 without). The thread is started at the first offer. A
//! window is summed by its flusher as before (the offer refused) when it
//! is off, when the queue already holds
//! [`QUEUE`] windows (the thread falls behind: the allocating threads take
//! their share again, and the windows waiting stay few), when the thread
//! could not be started, in a child forked from the process that started it
//! (the thread does not survive `fork`), and under the model check (its
//! threads are its own). A child forked while a window was queued would
//! wait for it at its next check-in, as for a lock held across `fork`: an
//! allocator is not to be used across `fork` with the thread on (CUDA's
//! context does not survive it either).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use super::{Entry, Folds, Taken, summarize};
use crate::engine::shard::SHARDS;
use crate::engine::sync::{self, Mutex};

/// Windows that may wait for the stats thread; a flush past them sums its
/// own.
pub(crate) const QUEUE: usize = 4;

/// A window taken out by a flush, for the stats thread to sum and file.
pub(crate) struct Job {
    /// The allocator's folds, where the sum goes.
    pub folds: Arc<Mutex<Folds>>,
    /// The window's number.
    pub window: u64,
    /// The logs the flush took out.
    pub taken: Taken,
    /// The spare logs the flush took for the swap and did not use.
    pub fresh: [Vec<Entry>; 2 * SHARDS],
}

impl Job {
    /// Sums the window and files the sum; the logs, and the spares the
    /// swap did not use, become spares.
    pub(crate) fn run(mut self) {
        let sum = summarize(&self.taken);
        let mut f = sync::lock(&self.folds);
        f.deposit(self.window, sum);
        f.give_back(self.taken.iter_mut().flatten());
        f.give_back(&mut self.fresh);
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns the stats thread on or off for the flushes that follow, in the
/// whole process (off by default: each flush sums its window on its own
/// thread; `cachalot threads --stats-thread on` measures the other way).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether flushes hand their windows to the stats thread.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

static SUMMED: AtomicU64 = AtomicU64::new(0);

/// The windows the stats thread has summed in this process (for
/// benchmarks and tests).
pub fn summed() -> u64 {
    SUMMED.load(Ordering::Relaxed)
}

/// The stats thread's queue, and the process that started it.
struct Thread {
    pid: u32,
    queue: SyncSender<Job>,
}

static THREAD: OnceLock<Option<Thread>> = OnceLock::new();

fn start() -> Option<Thread> {
    let (queue, jobs) = sync_channel::<Job>(QUEUE);
    std::thread::Builder::new()
        .name("cachalot-stats".into())
        .spawn(move || {
            for job in jobs {
                job.run();
                SUMMED.fetch_add(1, Ordering::Relaxed);
            }
        })
        .ok()?;
    Some(Thread {
        pid: std::process::id(),
        queue,
    })
}

/// Hands `job` to the stats thread; gives it back when the thread will not
/// take it (the module's header says when): the caller then runs it.
pub(crate) fn offer(job: Job) -> Option<Job> {
    if cfg!(feature = "shuttle") || !enabled() {
        return Some(job);
    }
    match THREAD.get_or_init(start) {
        Some(t) if t.pid == std::process::id() => match t.queue.try_send(job) {
            Ok(()) => None,
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => Some(job),
        },
        _ => Some(job),
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::engine::stat_log::{AllocTransitions, Entry, LOG_CAP, Rec};
    use crate::stats::{DeviceStats, StatType};

    /// Two shards' logs, interleaved: allocations of 1 MiB, then frees.
    fn window() -> Taken {
        // (logs of the shards' capacity: only those are kept as spares)
        let mut taken: Taken =
            std::array::from_fn(|_| [Vec::with_capacity(LOG_CAP), Vec::with_capacity(LOG_CAP)]);
        let mut ts = 1;
        for i in 0..40u64 {
            for (k, shard) in taken.iter_mut().enumerate().take(2) {
                let size = (1 << 20) * (k as u64 + 1);
                let rec = Rec::Alloc(AllocTransitions {
                    st: StatType::LargePool,
                    split: false,
                    already_split: false,
                    block_size: size,
                    rounded: size,
                    requested: size - i,
                    oversize: false,
                    expandable: false,
                });
                shard[1].push(Entry::of(&rec, ts));
                ts += 1;
            }
        }
        taken
    }

    fn folded(folds: &Mutex<Folds>) -> DeviceStats {
        let mut stats = DeviceStats::default();
        let mut next = 0;
        sync::lock(folds).fold_ready(&mut next, &mut stats);
        assert_eq!(next, 1, "the window was filed");
        stats
    }

    #[test]
    fn the_stats_thread_files_what_the_flusher_would() {
        // what the flushing thread itself files
        let inline = Arc::new(Mutex::new(Folds::default()));
        Job {
            folds: Arc::clone(&inline),
            window: 0,
            taken: window(),
            fresh: Default::default(),
        }
        .run();
        let want = folds_stats(&folded(&inline));
        assert!(want.iter().any(|&(_, v)| v > 0));

        // off: the offer comes back
        set_enabled(false);
        let folds = Arc::new(Mutex::new(Folds::default()));
        let job = Job {
            folds: Arc::clone(&folds),
            window: 0,
            taken: window(),
            fresh: Default::default(),
        };
        let job = offer(job).expect("refused while off");

        // on: the thread sums it and files it
        set_enabled(true);
        let r = offer(job);
        set_enabled(false);
        assert!(r.is_none(), "the stats thread took the window");
        let t0 = std::time::Instant::now();
        while sync::lock(&folds).waiting() == 0 {
            assert!(
                t0.elapsed().as_secs() < 30,
                "the stats thread never filed the window"
            );
            std::thread::yield_now();
        }
        assert_eq!(folds_stats(&folded(&folds)), want);
        // its logs came back as spares
        assert!(!sync::lock(&folds).spares.is_empty());
    }

    fn folds_stats(s: &DeviceStats) -> Vec<(String, i64)> {
        s.to_flat().into_iter().collect()
    }
}
