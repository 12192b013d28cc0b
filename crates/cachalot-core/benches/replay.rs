//! Warm trace replay on the mock device: one pass over each recorded trace
//! (the cache already holds the first pass's segments), as `cachalot replay`
//! measures `warm_ns_per_op`. Throughput is reported in operations.
// criterion's macros generate undocumented items
#![allow(missing_docs)]

use std::path::PathBuf;

use cachalot_core::replay::{Trace, replay, replay_pass};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};
use cachalot_mock::MockConfig;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

fn replay_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("replay_warm_pass");
    g.sample_size(20);
    for name in [
        "gpt2_train",
        "resnet50_train",
        "side_stream_pipeline",
        "hit_1mib",
    ] {
        let trace = Trace::synthetic(name)
            .map(Ok)
            .unwrap_or_else(|| Trace::load(traces_dir().join(format!("{name}.trace"))))
            .expect("trace");
        let m = MockConfig::new(150_754_820_096).auto_complete(true).build();
        let streams = vec![m.default_stream(), m.create_stream()];
        let a = CachingAllocator::with_config(m, AllocatorConfig::default()).expect("allocator");
        // cold pass fills the cache; each measured iteration is one warm pass
        let mut ptr = vec![0u64; trace.num_ids];
        let run = |ptr: &mut Vec<u64>| replay_pass(&a, &streams, &trace, ptr).expect("pass");
        run(&mut ptr);
        g.throughput(Throughput::Elements(trace.ops.len() as u64));
        g.bench_function(name, |b| b.iter(|| run(&mut ptr)));
        // the library replay agrees on the op count
        assert_eq!(
            replay(&a, &streams, &trace, 1, |_| {}).expect("replay").ops,
            trace.ops.len()
        );
    }
    g.finish();
}

criterion_group!(benches, replay_bench);
criterion_main!(benches);
