//! The hit path: allocate and free a cached block (no device call), on the
//! mock device, for a small-pool and a large-pool size, and with a second
//! stream's blocks in the cache.
// criterion's macros generate undocumented items
#![allow(missing_docs)]

use cachalot_core::engine::history::set_current_context;
use cachalot_core::engine::{HistoryConfig, HistoryContext};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};
use cachalot_mock::MockConfig;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn hit_path(c: &mut Criterion) {
    let m = MockConfig::new(80 << 30).auto_complete(true).build();
    let s = m.default_stream();
    let a = CachingAllocator::with_config(m, AllocatorConfig::default()).expect("allocator");
    for (name, size) in [
        ("alloc_free_1mib", 1u64 << 20),
        ("alloc_free_4kib", 4096),
        ("alloc_free_24mib", 24 << 20),
    ] {
        // warm the cache
        let p = a.allocate(size, s).expect("alloc");
        a.free(p).expect("free");
        c.bench_function(name, |b| {
            b.iter(|| {
                let p = a.allocate(black_box(size), s).expect("alloc");
                a.free(black_box(p)).expect("free");
            })
        });
    }
    // a busy cache: 1000 live blocks of mixed sizes around the hit
    let live: Vec<u64> = (0..1000u64)
        .map(|i| a.allocate(512 + (i * 7919) % (8 << 20), s).expect("alloc"))
        .collect();
    c.bench_function("alloc_free_1mib_with_1000_live", |b| {
        b.iter(|| {
            let p = a.allocate(black_box(1 << 20), s).expect("alloc");
            a.free(black_box(p)).expect("free");
        })
    });
    for p in live {
        a.free(p).expect("free");
    }
    // the memory history on (PyTorch's `_record_memory_history()`: every
    // action kept, contexts of allocations and frees), each call under a
    // context of its own as the PyTorch drop-in enters one per call; one
    // block stays live (as in a program), so no free empties the stream
    let keep = a.allocate(512, s).expect("alloc");
    a.record_memory_history(Some(HistoryConfig::default()));
    c.bench_function("alloc_free_1mib_history", |b| {
        b.iter(|| {
            let prev = set_current_context(Some(HistoryContext::new(1u64)));
            let p = a.allocate(black_box(1 << 20), s).expect("alloc");
            set_current_context(Some(HistoryContext::new(2u64)));
            a.free(black_box(p)).expect("free");
            set_current_context(prev);
        })
    });
    a.record_memory_history(None);
    a.free(keep).expect("free");
}

criterion_group!(benches, hit_path);
criterion_main!(benches);
