//! Misses at many streams, on the mock device in the default
//! configuration (cachalot's expandable mode): the time of one allocation
//! that its own stream's cache cannot serve, with N other streams known to
//! the allocator (10, 100, 1,000).
//!
//! - `lend/N`: N streams each cache one free 2 MiB block; a stream with
//!   no cache of its own allocates 2 MiB (a miss: another stream's block is
//!   lent to it) and frees it (the block goes back to its stream once the
//!   use is done). One iteration is that miss and that free.
//! - `grow/N`: N streams each hold one live 2 MiB block; a stream with no
//!   cache of its own allocates 2 MiB (a miss that nothing can lend: its
//!   segment maps pages) and frees it, then empties the cache so that the
//!   next allocation misses again. One iteration is that miss, the free and
//!   the `empty_cache`.
// criterion's macros generate undocumented items
#![allow(missing_docs)]

use cachalot_core::{AllocatorConfig, CachingAllocator};
use cachalot_mock::MockConfig;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

const BLOCK: u64 = 2 << 20;

fn many_streams(c: &mut Criterion) {
    let mut g = c.benchmark_group("many_streams_miss");
    g.sample_size(20);
    for n in [10usize, 100, 1000] {
        let m = MockConfig::new(150_754_820_096).auto_complete(true).build();
        let streams: Vec<_> = (0..n).map(|_| m.create_stream()).collect();
        let borrower = m.create_stream();
        let a = CachingAllocator::with_config(m, AllocatorConfig::default()).expect("allocator");
        let held: Vec<u64> = streams
            .iter()
            .map(|&s| a.allocate(BLOCK, s).expect("alloc"))
            .collect();
        for &p in &held {
            a.free(p).expect("free");
        }
        let lend = || {
            let p = a.allocate(black_box(BLOCK), borrower).expect("alloc");
            a.free(black_box(p)).expect("free");
        };
        // (checked before the measurement, which a filter may skip)
        let (lent_before, _) = a.lent_blocks();
        lend();
        lend();
        assert_eq!(a.lent_blocks().0, lent_before + 2, "each miss lends");
        g.bench_function(BenchmarkId::new("lend", n), |b| b.iter(lend));
        assert_eq!(
            a.memory_stats()["reserved_bytes.all.current"],
            (n as u64 * BLOCK) as i64,
            "nothing mapped for the borrower"
        );

        // every stream's block live: nothing to lend
        let held: Vec<u64> = streams
            .iter()
            .map(|&s| a.allocate(BLOCK, s).expect("alloc"))
            .collect();
        g.bench_function(BenchmarkId::new("grow", n), |b| {
            b.iter(|| {
                let p = a.allocate(black_box(BLOCK), borrower).expect("alloc");
                a.free(black_box(p)).expect("free");
                a.empty_cache().expect("empty_cache");
            })
        });
        for p in held {
            a.free(p).expect("free");
        }
    }
    g.finish();
}

criterion_group!(benches, many_streams);
criterion_main!(benches);
