//! The multi-thread benchmark of `cca_threads.cpp`.

use std::time::Instant;

use crate::backend::Backend;
use crate::engine::{CachingAllocator, PathCounts};
use crate::error::Error;

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
