//! What the stat logs' time stamp costs as threads are added (issue 18,
//! `docs/design-shards.md`, what bounds eight threads): T threads (1, 2, 4, 8, 16 by
//! default, or the comma-separated list given) each read the monotonic
//! clock the way the engine stamps a logged operation (`Instant`, then
//! nanoseconds since a start), N times (`CLOCK_READS`, default 2,000,000);
//! then the same threads each `fetch_add` one shared counter (the ordered
//! stamp without a clock); then the stamp the engine takes now
//! (`cachalot_clock::stamp`: the fenced TSC where usable, else the
//! monotonic clock). Prints one JSON line per thread count: ns per read on
//! each thread (median over threads) for each, and the stamp's source.
//!
//! Run: `cargo run --release -p cachalot-core --example clock_scaling [1,2,8,16]`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

fn per_thread(t: usize, n: u64, f: impl Fn() -> u64 + Send + Sync + Copy + 'static) -> f64 {
    let bar = Arc::new(Barrier::new(t));
    let hs: Vec<_> = (0..t)
        .map(|_| {
            let bar = bar.clone();
            std::thread::spawn(move || {
                bar.wait();
                let start = Instant::now();
                let mut acc = 0u64;
                for _ in 0..n {
                    acc = acc.wrapping_add(f());
                }
                std::hint::black_box(acc);
                start.elapsed().as_nanos() as f64 / n as f64
            })
        })
        .collect();
    let mut v: Vec<f64> = hs
        .into_iter()
        .map(|h| h.join().unwrap_or(f64::NAN))
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let list = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "1,2,4,8,16".to_string());
    let n: u64 = std::env::var("CLOCK_READS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| (1..=1_000_000_000).contains(&v))
        .unwrap_or(2_000_000);
    static SHARED: AtomicU64 = AtomicU64::new(0);
    let base = Instant::now();
    for t in list
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
    {
        let t = t.clamp(1, 256);
        let clock = per_thread(t, n, move || base.elapsed().as_nanos() as u64);
        let counter = per_thread(t, n, || SHARED.fetch_add(1, Ordering::Relaxed));
        let stamp = per_thread(t, n, cachalot_core::clock::stamp);
        println!(
            "{{\"threads\":{t},\"clock_ns\":{clock:.1},\"shared_counter_ns\":{counter:.1},\"stamp_ns\":{stamp:.1},\"stamp_source\":\"{}\"}}",
            cachalot_core::clock::source().name()
        );
    }
}
