//! `cachalot::accelerator` over the global mock allocator, in one test
//! (the globals are per process).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cachalot::{BackendKind, DeviceBuffer, Error, accelerator as acc, memory};

#[test]
fn accelerator_semantics_on_the_mock() {
    cachalot::init(BackendKind::Mock).unwrap();
    cachalot::init(BackendKind::Mock).unwrap();
    assert!(cachalot::init(BackendKind::Cuda).is_err());
    assert_eq!(cachalot::backend_kind().unwrap(), BackendKind::Mock);
    assert_eq!(acc::device_count().unwrap(), 1);
    assert_eq!(acc::current_device(), 0);
    assert!(acc::set_device(1).is_err());

    // Uninitialized: empty map, zeros, and nothing initializes the device.
    assert!(acc::memory_stats(None).unwrap().is_empty());
    assert_eq!(acc::memory_allocated(None).unwrap(), 0);
    assert_eq!(acc::max_memory_reserved(Some(0)).unwrap(), 0);
    acc::empty_cache().unwrap();
    acc::reset_peak_memory_stats(None).unwrap();
    acc::reset_accumulated_memory_stats(None).unwrap();
    assert!(
        acc::memory_summary(None, false)
            .unwrap()
            .contains("Allocated memory")
    );
    assert!(cachalot::try_allocator(None).unwrap().is_none());
    assert!(acc::memory_stats(Some(5)).is_err());

    // The accelerator test of PyTorch (test_accelerator.py::test_memory_stats).
    let buf = DeviceBuffer::new(400).unwrap();
    drop(buf);
    acc::empty_cache().unwrap();
    let stats = acc::memory_stats(None).unwrap();
    assert_eq!(stats.len(), 122);
    let keys: Vec<_> = stats.keys().cloned().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for k in [
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "requested_bytes",
    ] {
        for p in ["all", "small_pool", "large_pool"] {
            for f in ["peak", "current", "allocated", "freed"] {
                assert!(stats.contains_key(&format!("{k}.{p}.{f}")));
            }
        }
    }
    assert!(acc::max_memory_allocated(None).unwrap() > 0);
    assert!(acc::max_memory_reserved(None).unwrap() > 0);
    let (alloc0, reserved0) = (
        acc::memory_allocated(None).unwrap(),
        acc::memory_reserved(None).unwrap(),
    );
    let t = DeviceBuffer::new(256 * 4).unwrap();
    assert!(acc::memory_allocated(None).unwrap() > alloc0);
    drop(t);
    acc::empty_cache().unwrap();
    acc::reset_peak_memory_stats(None).unwrap();
    assert_eq!(acc::memory_allocated(None).unwrap(), alloc0);
    assert_eq!(acc::memory_reserved(None).unwrap(), reserved0);
    assert_eq!(acc::max_memory_allocated(None).unwrap(), alloc0);

    acc::reset_accumulated_memory_stats(None).unwrap();
    let before = acc::memory_stats(None).unwrap()["active_bytes.all.current"];
    let t = DeviceBuffer::new(256 * 4).unwrap();
    let s = acc::memory_stats(None).unwrap();
    assert_eq!(s["active_bytes.all.current"] - before, 1024);
    assert_eq!(s["active_bytes.all.freed"], 0);
    drop(t);
    acc::empty_cache().unwrap();
    assert_eq!(
        acc::memory_stats(None).unwrap()["active_bytes.all.freed"],
        1024
    );

    let (free, total) = cachalot::mem_get_info(None).unwrap();
    assert_eq!(total, cachalot::H200_TOTAL_MEMORY);
    assert!(free <= total);
    // torch.accelerator's name for the same function
    assert_eq!(acc::get_memory_info(None).unwrap(), (free, total));

    // torch.cuda.memory_stats_as_nested_dict: the flat keys nested at their dots
    let flat = memory::memory_stats(None).unwrap();
    let nested = cachalot::memory_stats_as_nested_dict(None).unwrap();
    assert_eq!(
        nested["active_bytes"].get_path("all.freed"),
        Some(flat["active_bytes.all.freed"])
    );
    assert_eq!(nested["num_ooms"].as_i64(), Some(flat["num_ooms"]));
    let all = nested["reserved_bytes"].get("all").unwrap();
    assert_eq!(
        all.get_path("current"),
        Some(flat["reserved_bytes.all.current"])
    );
    let dev = cachalot::allocator(None).unwrap();
    assert_eq!(dev.memory_stats_as_nested_dict(), nested);

    // Streams, record_stream and raw pointers.
    let side = cachalot::new_stream(None).unwrap();
    assert_eq!(side.device(), 0);
    let b = DeviceBuffer::on_stream(5 << 20, side).unwrap();
    assert_eq!(b.stream(), side);
    assert_eq!(b.size(), 5 << 20);
    b.record_stream(cachalot::default_stream(None)).unwrap();
    let p = cachalot::raw_alloc(1 << 20, cachalot::default_stream(None)).unwrap();
    assert_ne!(p, 0);
    cachalot::record_stream(p, side).unwrap();
    cachalot::raw_free(p, None).unwrap();
    assert!(matches!(
        cachalot::raw_free(p, None),
        Err(Error::DoubleFree(_) | Error::UnknownPointer(_) | Error::NotLive(_))
    ));
    assert_eq!(cachalot::raw_alloc(0, side).unwrap(), 0);
    let raw = b.into_raw();
    cachalot::raw_free(raw, None).unwrap();

    // OOM: observers run before the error returns; the report says whether
    // emptying the cache would help.
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    cachalot::add_oom_observer(move |r| {
        assert!(r.requested > 0);
        s2.fetch_add(1, Ordering::SeqCst);
    });
    let err = DeviceBuffer::new(cachalot::H200_TOTAL_MEMORY * 2).unwrap_err();
    assert!(
        matches!(err, Error::OutOfMemory(_) | Error::NeverFits { .. }),
        "{err}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    if let Error::OutOfMemory(r) = &err {
        assert!(!r.fits_after_empty_cache);
    }
    assert!(err.to_string().contains("out of memory"), "{err}");
    assert_eq!(acc::memory_stats(None).unwrap()["num_ooms"], 1);

    // torch.cuda.set_per_process_memory_fraction: a request above the cap
    // is an out-of-memory error; out of [0, 1] is an error that changes nothing.
    assert_eq!(
        cachalot::get_per_process_memory_fraction(None).unwrap(),
        1.0
    );
    cachalot::set_per_process_memory_fraction(0.25, None).unwrap();
    assert_eq!(
        memory::get_per_process_memory_fraction(Some(0)).unwrap(),
        0.25
    );
    let quarter = cachalot::H200_TOTAL_MEMORY / 4;
    let err = DeviceBuffer::new(quarter + (64 << 20)).unwrap_err();
    assert!(matches!(err, Error::NeverFits { .. }), "{err}");
    assert!(err.to_string().contains("allowed"), "{err}");
    for bad in [-0.1, 1.5, f64::NAN] {
        assert!(memory::set_per_process_memory_fraction(bad, None).is_err());
        assert!(DeviceBuffer::new(quarter + (64 << 20)).is_err(), "{bad}");
    }
    assert_eq!(memory::get_per_process_memory_fraction(None).unwrap(), 0.25);
    memory::set_per_process_memory_fraction(1.0, Some(0)).unwrap();
    drop(DeviceBuffer::new(quarter + (64 << 20)).unwrap());
    assert!(memory::set_per_process_memory_fraction(0.5, Some(3)).is_err());
    acc::empty_cache().unwrap();

    // Snapshot and summary of the global allocators (torch.cuda.memory).
    memory::record_memory_history(Some(cachalot::HistoryConfig::default()), None).unwrap();
    let keep = DeviceBuffer::new(1 << 20).unwrap();
    let snaps = memory::snapshot();
    assert_eq!(snaps.len(), 1);
    assert!(
        snaps[0]
            .traces
            .iter()
            .any(|t| t.action == cachalot::TraceAction::Alloc)
    );
    let summary = cachalot::memory_summary(None, false).unwrap();
    assert_eq!(acc::memory_summary(None, false).unwrap(), summary);
    let short = memory::memory_summary(Some(0), true).unwrap();
    assert!(short.lines().count() < summary.lines().count());
    assert!(!short.contains("from large pool") && summary.contains("from large pool"));
    assert!(summary.contains("memory summary, device ID 0"));
    assert!(
        summary.contains("|       1024 KiB |") || summary.contains("  1024 KiB"),
        "{summary}"
    );

    // _dump_snapshot: a pickle by its name, else JSON.
    let dir = std::env::temp_dir().join(format!("cachalot-acc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    memory::dump_snapshot(dir.join("s.pickle")).unwrap();
    memory::dump_snapshot(dir.join("s.json")).unwrap();
    let pickle = std::fs::read(dir.join("s.pickle")).unwrap();
    assert_eq!(&pickle[..2], b"\x80\x02", "pickle protocol 2");
    let json = std::fs::read_to_string(dir.join("s.json")).unwrap();
    assert!(
        json.starts_with('{') && json.contains("\"device_traces\""),
        "{json:.80}"
    );

    // The deprecated names do what the new ones do.
    #[allow(deprecated)]
    {
        assert_eq!(cachalot::memory_snapshot().len(), memory::snapshot().len());
        cachalot::dump_snapshot(dir.join("old.json")).unwrap();
        cachalot::record_memory_history(None, None).unwrap();
        assert!(
            memory::snapshot()[0].traces.is_empty(),
            "history off and cleared"
        );
        dev.set_memory_fraction(0.25).unwrap();
        assert!(DeviceBuffer::new(quarter + (64 << 20)).is_err());
        dev.set_memory_fraction(1.0).unwrap();
    }
    assert!(
        std::fs::read_to_string(dir.join("old.json"))
            .unwrap()
            .contains("\"segments\"")
    );
    std::fs::remove_dir_all(&dir).unwrap();
    drop(keep);
}
