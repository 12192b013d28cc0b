//! Device calls per pass of a trace replayed on the mock, and what they
//! would cost on an H200 at the driver's measured cost per call: the cost
//! model of `docs/design-expandable.md`, "A move budget".
//!
//! ```text
//! cargo run --release -p cachalot-conformance --example device_calls -- \
//!     [--passes N] [--config CFG]... [--chunk OPS] TRACE...
//! ```
//!
//! TRACE is a trace file or a synthetic name (`hit_1mib`, `churn_1stream`,
//! `churn_4streams`, `bert_serving`, `gpt2_generate`). For each trace and
//! config (default: the default config) it prints one line per pass: the
//! virtual-memory calls (create, map, set access, unmap, release), the
//! event calls (record, query, stream query, synchronize), `malloc` calls
//! (counted, not weighed), and the driver time they would take on an H200
//! per operation of the pass, at the costs `bench/vmm/vmm_cost.cpp`
//! measured (µs per call: create 8.1, map 1.0, set access 25.0 per mapping,
//! unmap 15.2, release 9.3; an event record or query, a stream query, 1.2);
//! then the peak reserved over the trace's live peak over all passes, and
//! the recycling allowance over the allocated peak at the end. With
//! `--chunk OPS`, the first three passes also print their calls and
//! memory every OPS operations. Streams: one mock stream per trace stream.

use cachalot_core::replay::{Op, Trace, replay_pass};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};
use cachalot_mock::{MockBackend, MockCall, MockConfig};

const H200: u64 = 150_754_820_096;

/// (call, label, µs per call on the H200)
const CALLS: [(MockCall, &str, f64); 10] = [
    (MockCall::CreatePhysical, "create", 8.1),
    (MockCall::Map, "map", 1.0),
    (MockCall::SetAccess, "access", 0.0),
    (MockCall::Unmap, "unmap", 15.2),
    (MockCall::ReleasePhysical, "release", 9.3),
    (MockCall::RecordEvent, "record", 1.2),
    (MockCall::QueryEvent, "query", 1.2),
    (MockCall::QueryStream, "squery", 1.2),
    (MockCall::SynchronizeEvent, "sync", 1.2),
    (MockCall::Malloc, "malloc", 0.0),
];
/// `cuMemSetAccess` costs about 25 µs per mapping it covers: counted per map.
const ACCESS_PER_MAP: f64 = 25.0;

fn live_peak(t: &Trace) -> u64 {
    let mut size = vec![0u64; t.num_ids];
    let (mut live, mut peak) = (0u64, 0u64);
    for op in &t.ops {
        match *op {
            Op::Alloc { id, size: s, .. } => {
                size[id as usize] = s;
                live += s;
                peak = peak.max(live);
            }
            Op::Free { id } => live -= size[id as usize],
        }
    }
    peak
}

fn counts(m: &MockBackend) -> Vec<u64> {
    CALLS.iter().map(|c| m.call_count(c.0)).collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut passes, mut configs, mut traces) = (5usize, Vec::new(), Vec::new());
    let mut chunk = 0usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--passes" => {
                passes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--passes N")
            }
            "--config" => configs.push(args.next().expect("--config CFG")),
            "--chunk" => chunk = args.next().and_then(|v| v.parse().ok()).expect("--chunk N"),
            _ => traces.push(a),
        }
    }
    if configs.is_empty() {
        configs.push(String::new());
    }
    for name in &traces {
        let t = Trace::synthetic(name)
            .unwrap_or_else(|| Trace::load(name).unwrap_or_else(|e| panic!("{name}: {e}")));
        let live = live_peak(&t) as f64;
        for cfg in &configs {
            let m = MockConfig::new(H200).auto_complete(true).build();
            let a = CachingAllocator::with_config(
                m.clone(),
                AllocatorConfig::parse(cfg).expect("config"),
            )
            .expect("allocator");
            let mut streams = vec![m.default_stream()];
            for _ in 1..t.num_streams {
                streams.push(m.create_stream());
            }
            let mut ptr = vec![0u64; t.num_ids];
            println!("== {} [{}] ops {}", t.name, cfg, t.ops.len());
            let mut total_us = 0.0;
            for pass in 0..passes {
                let c0 = counts(&m);
                let t0 = std::time::Instant::now();
                if chunk > 0 && pass < 3 {
                    let mut c1 = counts(&m);
                    for (i, op) in t.ops.iter().enumerate() {
                        match *op {
                            Op::Alloc { id, size, stream } => {
                                ptr[id as usize] =
                                    a.allocate(size, streams[stream as usize]).expect("alloc")
                            }
                            Op::Free { id } => {
                                a.free(std::mem::take(&mut ptr[id as usize])).expect("free")
                            }
                        }
                        if (i + 1) % chunk == 0 {
                            let c2 = counts(&m);
                            let s = a.stats();
                            println!(
                                "    op {:>7}: create {:>5} map {:>5} unmap {:>5}; reserved {:.4} alloc-peak {:.4} allocated {:.4}",
                                i + 1,
                                c2[0] - c1[0],
                                c2[1] - c1[1],
                                c2[3] - c1[3],
                                s.reserved_bytes.all().current as f64 / live,
                                s.allocated_bytes.all().peak as f64 / live,
                                s.allocated_bytes.all().current as f64 / live
                            );
                            c1 = c2;
                        }
                    }
                    for p in ptr.iter_mut() {
                        if *p != 0 {
                            a.free(std::mem::take(p)).expect("free");
                        }
                    }
                } else {
                    replay_pass(&a, &streams, &t, &mut ptr).expect("replay");
                }
                let ns = t0.elapsed().as_nanos() as f64 / t.ops.len() as f64;
                let d: Vec<u64> = counts(&m).iter().zip(&c0).map(|(x, y)| x - y).collect();
                let us: f64 = d
                    .iter()
                    .zip(&CALLS)
                    .map(|(n, c)| *n as f64 * c.2)
                    .sum::<f64>()
                    + d[1] as f64 * ACCESS_PER_MAP;
                total_us += us;
                let parts: Vec<String> = d
                    .iter()
                    .zip(&CALLS)
                    .filter(|(n, _)| **n > 0)
                    .map(|(n, c)| format!("{} {}", c.1, n))
                    .collect();
                println!(
                    "  pass {pass}: {:.1} ns/op engine (mock), driver {:.1} ns/op on an H200; {}",
                    ns,
                    us * 1000.0 / t.ops.len() as f64,
                    parts.join(", ")
                );
            }
            let s = a.stats();
            println!(
                "  peak reserved / live peak {:.4} (peak allocated / live {:.4}); driver {:.1} ns/op over all passes; lent {:?}, ghosts {}, allowance {:.4}",
                s.reserved_bytes.all().peak as f64 / live,
                s.allocated_bytes.all().peak as f64 / live,
                total_us * 1000.0 / (passes * t.ops.len()) as f64,
                a.lent_blocks(),
                a.ghost_mappings(),
                a.recycling_allowance() as f64 / s.allocated_bytes.all().peak as f64
            );
        }
    }
}
