//! Placement, capacity, failure injection and counters of the mock device.

use cachalot_core::{Backend, DeviceAllocError};
use cachalot_mock::{
    CHUNK, DEFAULT_BASE_ADDRESS, MallocFailure, MockBackend, MockConfig, Placement, codes,
};

const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

fn oom(r: Result<u64, DeviceAllocError>) -> bool {
    matches!(r, Err(DeviceAllocError::OutOfMemory))
}

fn backend_code(r: Result<u64, DeviceAllocError>) -> Option<i64> {
    match r {
        Err(DeviceAllocError::Backend(e)) => Some(e.code),
        _ => None,
    }
}

#[test]
fn default_range_and_placement() {
    let dev = MockBackend::new(G);
    assert_eq!(dev.placement(), Placement::Cuda13);
    assert_eq!(dev.address_range(), (DEFAULT_BASE_ADDRESS, 1 << 40));
    let big = MockBackend::new(1 << 40);
    assert_eq!(big.address_range(), (DEFAULT_BASE_ADDRESS, 4 << 40));
}

#[test]
fn cuda13_layout_matches_hand_computed() {
    let dev = MockBackend::new(G);
    let (base, size) = dev.address_range();
    let t = base + size; // top of the range
    let a = dev.malloc(20 * M).unwrap();
    assert_eq!(
        a,
        t - 32 * M,
        "first segment at the low end of the top chunk"
    );
    let b = dev.malloc(2 * M).unwrap();
    assert_eq!(b, t - 12 * M, "second fills the chunk's tail");
    let c = dev.malloc(40 * M).unwrap();
    assert_eq!(c, t - 96 * M, "40 MiB claims 64 MiB below");
    let d = dev.malloc(10 * M).unwrap();
    assert_eq!(d, t - 56 * M, "lowest leftover that fits");
    dev.free(a, 20 * M).unwrap();
    // Hole [t-46, t-12) after coalescing the freed segment with the tail.
    let e = dev.malloc(30 * M).unwrap();
    assert_eq!(e, t - 46 * M);
    let f = dev.malloc(512).unwrap();
    assert_eq!(f, t - 16 * M);
    let g = dev.malloc(2 * M).unwrap();
    assert_eq!(g, t - 14 * M, "2 MiB alignment for big segments");
    let g2 = dev.malloc(2 * M + 512).unwrap();
    assert_eq!(g2, t - 10 * M, "the gap below g is too small once aligned");
    let h = dev.malloc(64 * M).unwrap();
    assert_eq!(h, t - 160 * M);
    let small = dev.malloc(1024).unwrap();
    assert_eq!(small, t - 16 * M + 512, "alignment gap stays usable");
    for (p, s) in dev.live_segments() {
        dev.free(p, s).unwrap();
    }
    assert_eq!(dev.live_bytes(), 0);
    // Everything claimed coalesced into one hole of 160 MiB.
    assert_eq!(dev.malloc(100 * M).unwrap(), t - 160 * M);
    assert_eq!(dev.malloc(60 * M).unwrap(), t - 60 * M);
    assert_eq!(dev.malloc(2 * M).unwrap(), t - 192 * M, "new chunk below");
}

#[test]
fn increasing_layout_matches_hand_computed() {
    let dev = MockConfig::new(G).placement(Placement::Increasing).build();
    let (b, _) = dev.address_range();
    assert_eq!(dev.malloc(20 * M).unwrap(), b);
    assert_eq!(dev.malloc(2 * M).unwrap(), b + 20 * M);
    assert_eq!(dev.malloc(512).unwrap(), b + 22 * M);
    assert_eq!(dev.malloc(4 * M).unwrap(), b + 24 * M);
    assert_eq!(dev.malloc(1024).unwrap(), b + 22 * M + 512);
    dev.free(b, 20 * M).unwrap();
    assert_eq!(dev.malloc(10 * M).unwrap(), b);
    assert_eq!(
        dev.malloc(12 * M).unwrap(),
        b + 28 * M,
        "10 MiB hole too small"
    );
    assert_eq!(dev.malloc(8 * M).unwrap(), b + 10 * M);
}

fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 17
}

fn random_run(dev: &MockBackend, seed: u64) -> Vec<u64> {
    let mut x = seed;
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..2000 {
        let r = lcg(&mut x);
        if r.is_multiple_of(3) && !live.is_empty() {
            let (p, s) = live.swap_remove((r as usize / 3) % live.len());
            dev.free(p, s).unwrap();
        } else {
            let size = if r.is_multiple_of(2) {
                ((r >> 8) % 64 + 1) * 2 * M
            } else {
                ((r >> 8) % 4096 + 1) * 512
            };
            match dev.malloc(size) {
                Ok(p) => {
                    out.push(p);
                    live.push((p, size));
                }
                Err(DeviceAllocError::OutOfMemory) => out.push(0),
                Err(e) => panic!("{e}"),
            }
        }
    }
    out
}

#[test]
fn placement_is_deterministic_and_sound() {
    for placement in [Placement::Cuda13, Placement::Increasing] {
        let d1 = MockConfig::new(4 * G).placement(placement).build();
        let d2 = MockConfig::new(4 * G).placement(placement).build();
        assert_eq!(random_run(&d1, 7), random_run(&d2, 7));
        let (base, size) = d1.address_range();
        let segs = d1.live_segments();
        for w in segs.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{placement:?} overlap {w:?}");
        }
        for (p, s) in segs {
            assert!(p >= base && p + s <= base + size);
            let align = if s >= 2 * M { 2 * M } else { 512 };
            assert_eq!(p % align, 0);
        }
    }
}

#[test]
fn cuda13_claims_are_chunk_aligned() {
    let dev = MockBackend::new(16 * G);
    let (base, size) = dev.address_range();
    for k in 1..20u64 {
        let p = dev.malloc(k * 33 * M).unwrap();
        assert_eq!(p % CHUNK, 0, "a new claim starts a chunk");
        assert!(p >= base && p < base + size);
    }
}

#[test]
fn oom_at_capacity_and_memory_info() {
    let dev = MockBackend::new(64 * M);
    let a = dev.malloc(32 * M).unwrap();
    let _b = dev.malloc(32 * M).unwrap();
    let info = dev.memory_info().unwrap();
    assert_eq!((info.free, info.total), (0, 64 * M));
    assert!(oom(dev.malloc(512)));
    dev.free(a, 32 * M).unwrap();
    assert_eq!(dev.memory_info().unwrap().free, 32 * M);
    assert!(oom(dev.malloc(32 * M + 512)));
    assert!(dev.malloc(32 * M).is_ok());
    assert!(oom(dev.malloc(1 << 62)));
    let c = dev.counters();
    assert_eq!(c.malloc, 6);
    assert_eq!(c.malloc_failed, 3);
    assert_eq!(c.free, 1);
    assert_eq!(c.memory_info, 2);
}

#[test]
fn capacity_and_external_usage() {
    let dev = MockBackend::new(G);
    let a = dev.malloc(256 * M).unwrap();
    dev.set_capacity(128 * M);
    assert!(oom(dev.malloc(512)));
    assert_eq!(dev.memory_info().unwrap().free, 0);
    dev.free(a, 256 * M).unwrap();
    assert!(dev.malloc(128 * M).is_ok());
    dev.set_capacity(G);
    dev.set_external_usage(800 * M);
    let info = dev.memory_info().unwrap();
    assert_eq!(info.free, G - 800 * M - 128 * M);
    assert!(oom(dev.malloc(100 * M)));
    assert!(dev.malloc(96 * M).is_ok());
}

#[test]
fn address_space_exhaustion_is_oom() {
    let dev = MockConfig::new(G).address_space(64 * M).build();
    assert!(dev.malloc(40 * M).is_ok());
    assert!(oom(dev.malloc(40 * M)), "no room left in the range");
    assert!(dev.malloc(20 * M).is_ok(), "the chunk tail still fits");
}

#[test]
fn invalid_sizes_and_frees_are_errors() {
    let dev = MockBackend::new(G);
    assert_eq!(backend_code(dev.malloc(0)), Some(codes::INVALID_VALUE));
    assert_eq!(backend_code(dev.malloc(1000)), Some(codes::INVALID_VALUE));
    let p = dev.malloc(4 * M).unwrap();
    let e = dev.free(p + 512, 512).unwrap_err();
    assert_eq!(e.code, codes::INVALID_DEVICE_POINTER);
    assert!(e.message.contains("inside"), "{e}");
    let e = dev.free(p, 2 * M).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE);
    assert_eq!(e.backend, "mock");
    assert_eq!(e.call, "free");
    assert_eq!(
        dev.free(0x1234, 512).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER
    );
    dev.free(p, 4 * M).unwrap();
    assert_eq!(
        dev.free(p, 4 * M).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER,
        "double free"
    );
    let c = dev.counters();
    assert_eq!(c.free, 5);
    assert_eq!(c.free_failed, 4);
    assert_eq!(c.errors, 6);
}

#[test]
fn malloc_failure_injection() {
    let dev = MockBackend::new(G);
    dev.fail_malloc_at(2);
    dev.fail_malloc_at_with(4, MallocFailure::Backend(719));
    assert!(dev.malloc(2 * M).is_ok());
    assert!(oom(dev.malloc(2 * M)));
    assert!(dev.malloc(2 * M).is_ok());
    assert_eq!(backend_code(dev.malloc(2 * M)), Some(719));
    assert!(dev.malloc(2 * M).is_ok());
    assert_eq!(dev.segment_count(), 3);
    dev.fail_malloc_at(1);
    dev.clear_failures();
    assert!(dev.malloc(2 * M).is_ok());
    assert_eq!(dev.counters().malloc_failed, 2);
}

#[test]
fn event_and_free_failure_injection() {
    let dev = MockBackend::new(G);
    dev.fail_create_event_at(2);
    let e1 = dev.create_event().unwrap();
    let err = dev.create_event().unwrap_err();
    assert_eq!(err.code, codes::INJECTED);
    let e3 = dev.create_event().unwrap();
    assert_eq!(dev.live_events(), 2);
    assert_eq!(dev.counters().create_event_failed, 1);
    dev.destroy_event(e1).unwrap();
    dev.destroy_event(e3).unwrap();
    assert_eq!(dev.live_events(), 0);

    let p = dev.malloc(2 * M).unwrap();
    dev.fail_free_at(1);
    assert_eq!(dev.free(p, 2 * M).unwrap_err().code, codes::INJECTED);
    assert_eq!(dev.live_segments(), vec![(p, 2 * M)]);
    dev.free(p, 2 * M).unwrap();
    assert!(dev.live_segments().is_empty());
}

#[test]
fn counters_reset_and_clones_share_state() {
    let dev = MockBackend::new(G);
    let other = dev.clone();
    let p = other.malloc(2 * M).unwrap();
    assert_eq!(dev.live_segments(), vec![(p, 2 * M)]);
    assert_eq!(dev.counters().malloc, 1);
    dev.reset_counters();
    assert_eq!(other.counters(), Default::default());
    assert_eq!(dev.name(), "mock");
    assert_eq!(MockConfig::new(G).device(3).build().device(), 3);
    assert!(dev.capture().is_some());
}

#[test]
fn backend_is_thread_safe() {
    let dev = MockBackend::new(16 * G);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let d = dev.clone();
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let p = d.malloc(2 * M).unwrap();
                    d.free(p, 2 * M).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(dev.counters().malloc, 800);
    assert_eq!(dev.live_bytes(), 0);
}
