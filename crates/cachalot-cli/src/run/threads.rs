//! `cachalot threads`: the multi-thread benchmark of PyTorch's
//! `cca_threads.cpp`, with the stat logs' clock and the stats thread chosen.

use super::*;

/// The clock `cachalot threads --clock` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// The invariant TSC behind an `lfence` (the monotonic clock where
    /// there is none).
    Tsc,
    /// The monotonic clock.
    Monotonic,
}

/// On or off (`cachalot threads --stats-thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// `cachalot threads`: the multi-thread benchmark, one fresh allocator per
/// thread count, one JSON line each (`cca_threads.cpp`'s fields, then
/// `clock`: the stat logs' clock, `tsc` or `monotonic`, `stats_thread`:
/// whether the stats thread was on, and `stats_thread_windows`: the
/// flushed windows it summed during the run, its warm-up included; when
/// its queue is full, the allocating threads sum theirs).
pub fn threads_cmd(
    opts: &DeviceOpts,
    threads: &[usize],
    ops: u64,
    clock: Clock,
    stats_thread: OnOff,
) -> Result<(), CliError> {
    use cachalot::core::clock::{self, Source};
    cachalot::core::engine::set_stats_thread(stats_thread == OnOff::On);
    // before any allocator stamps (the source is fixed at the first stamp)
    let want = match clock {
        Clock::Tsc => Source::Tsc,
        Clock::Monotonic => Source::Monotonic,
    };
    let source = clock::prefer(want).map_err(|e| CliError::failure(e.to_string()))?;
    let setup = Setup::new(opts)?;
    for &t in threads {
        // clap bounds the count; checked again for a direct caller
        if !(1..=cachalot::MAX_BENCH_THREADS).contains(&t) {
            return Err(CliError::usage(format!(
                "--threads: thread count {t} is outside 1..={}",
                cachalot::MAX_BENCH_THREADS
            )));
        }
        let dev = setup.open()?;
        let summed = cachalot::core::engine::stats_thread_windows();
        let r = dev
            .threads_bench(t, ops)
            .map_err(failure(&format!("running {t} threads")))?;
        let summed = cachalot::core::engine::stats_thread_windows() - summed;
        let mut line = r.to_json();
        if line.ends_with('}') {
            line.pop();
            line.push_str(&format!(
                ",\"clock\":\"{}\",\"stats_thread\":{},\"stats_thread_windows\":{summed}}}",
                source.name(),
                cachalot::core::engine::stats_thread_enabled()
            ));
        }
        print_out(&format!("{line}\n"))?;
    }
    Ok(())
}
