//! Hostile input to the engine (issue 17): bad pointers classified by
//! where they point, and extreme configuration values end to end.

use cachalot_core::config::{MAX_ROUNDUP_DIVISIONS, MAX_SIZE_MB};
use cachalot_core::engine::rounding::MAX_REQUEST;
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{MockBackend, MockConfig};

fn allocator(config: AllocatorConfig) -> CachingAllocator<MockBackend> {
    let m = MockConfig::new(80 << 30).auto_complete(true).build();
    CachingAllocator::with_config(m, config).expect("allocator")
}

#[test]
fn bad_pointers_are_told_apart() {
    let a = allocator(AllocatorConfig::default());
    let s = a.backend().default_stream();
    let p = a.allocate(4096, s).unwrap();
    let q = a.allocate(4096, s).unwrap();
    assert_eq!(q, p + 4096, "both in one small segment");
    // inside a live allocation, not its start
    for (addr, via_free) in [(p + 8, true), (p + 4095, true), (q + 1, false)] {
        let e = if via_free {
            a.free(addr)
        } else {
            a.record_stream(addr, s)
        }
        .unwrap_err();
        let block = if addr < q { p } else { q };
        assert!(
            matches!(e, Error::InteriorPointer { addr: x, block: b, size: 4096 } if x == addr && b == block),
            "{addr:#x}: {e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("inside the live allocation"), "{msg}");
        assert!(msg.contains(&format!("offset {}", addr - block)), "{msg}");
    }
    // nothing changed: both are still live and free normally
    assert_eq!(a.stats().active_bytes.all().current, 8192);
    a.free(p).unwrap();
    // the start of a freed (cached) block, and inside it
    assert!(matches!(a.free(p), Err(Error::DoubleFree(x)) if x == p));
    assert!(matches!(a.free(p + 8), Err(Error::DoubleFree(x)) if x == p + 8));
    assert!(matches!(a.record_stream(p, s), Err(Error::NotLive(x)) if x == p));
    // the segment's free remainder past q
    let tail = q + 4096 + 100;
    assert!(matches!(a.free(tail), Err(Error::DoubleFree(x)) if x == tail));
    // not in any segment
    for addr in [1, u64::MAX, u64::MAX - 1] {
        assert!(matches!(a.free(addr), Err(Error::UnknownPointer(x)) if x == addr));
        assert!(matches!(a.record_stream(addr, s), Err(Error::UnknownPointer(x)) if x == addr));
    }
    a.free(q).unwrap();
    assert_eq!(a.stats().active_bytes.all().current, 0);
}

#[test]
fn extreme_config_values_do_not_overflow_the_engine() {
    for conf in [
        format!(
            "roundup_power2_divisions:{MAX_ROUNDUP_DIVISIONS},large_segment_size_mb:{MAX_SIZE_MB},\
             max_split_size_mb:{MAX_SIZE_MB},max_non_split_rounding_mb:{MAX_SIZE_MB}"
        ),
        format!("roundup_power2_divisions:[1:{MAX_ROUNDUP_DIVISIONS},>:{MAX_ROUNDUP_DIVISIONS}]"),
        format!("max_split_size_mb:20,max_non_split_rounding_mb:{MAX_SIZE_MB}"),
        "garbage_collection_threshold:0.999999,per_process_memory_fraction:0.000001".to_string(),
        "per_process_memory_fraction:0".to_string(),
    ] {
        let a = allocator(AllocatorConfig::parse(&conf).unwrap());
        let s = a.backend().default_stream();
        for size in [
            1,
            1 << 20,
            (1 << 20) + 1,
            64 << 20,
            1 << 40,
            MAX_REQUEST - 1,
        ] {
            match a.allocate(size, s) {
                Ok(p) => a.free(p).unwrap(),
                Err(Error::OutOfMemory(_) | Error::NeverFits { .. }) => {}
                Err(e) => panic!("{conf}: {size}: {e}"),
            }
        }
        assert!(a.stats().reserved_bytes.all().current >= 0, "{conf}");
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0, "{conf}");
    }
}
