//! `placement:steady` (the default) against `placement:pytorch`: once a
//! stream has no block out of the default pool, its whole free segments are
//! taken again oldest first, so a workload that runs again replays its
//! first run's placement and makes no device call.

use cachalot_conformance::mock::{Dev, FIXED, MIB};
use cachalot_mock::MockStream;

/// A deterministic workload: `n` operations on two streams, each freeing a
/// random live block with probability `pfree`% and otherwise allocating
/// 512 B to 32 MiB (log-uniform); everything left is freed at the end.
/// `checked`: through the helpers that run the invariant checker after
/// every operation. Returns every address handed out, in order.
fn workload(
    d: &Dev,
    streams: &[MockStream; 2],
    seed: u64,
    n: usize,
    pfree: u64,
    checked: bool,
) -> Vec<u64> {
    let mut x = seed;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let free = |p: u64| {
        if checked {
            d.free(p)
        } else {
            d.a.free(p).expect("free")
        }
    };
    let mut live: Vec<u64> = Vec::new();
    let mut handed = Vec::new();
    for _ in 0..n {
        if !live.is_empty() && next() % 100 < pfree {
            let i = next() as usize % live.len();
            free(live.swap_remove(i));
        } else {
            let bits = 9 + next() % 17;
            let size = (1u64 << bits) + next() % (1u64 << bits);
            let s = streams[(next() % 2) as usize];
            let p = if checked {
                d.alloc_on(size, s)
            } else {
                d.a.allocate(size, s).expect("allocation")
            };
            handed.push(p);
            live.push(p);
        }
    }
    for p in live {
        free(p);
    }
    handed
}

#[test]
fn a_repeated_workload_replays_its_placement_with_no_device_call() {
    for seed in 1..=4 {
        let d = Dev::new(FIXED);
        let st = [d.s0(), d.stream()];
        let first = workload(&d, &st, seed, 2000, 45, true);
        let s = d.a.stats();
        let (allocs, peak) = (s.num_device_alloc, s.reserved_bytes.all().peak);
        for run in 2..=3 {
            let again = workload(&d, &st, seed, 2000, 45, true);
            let diverge = again.iter().zip(&first).position(|(a, b)| a != b);
            assert_eq!(
                (again.len(), diverge),
                (first.len(), None),
                "seed {seed} run {run}: same addresses"
            );
            let s = d.a.stats();
            assert_eq!(s.num_device_alloc, allocs, "seed {seed} run {run}");
            assert_eq!(s.num_device_free, 0);
            assert_eq!(s.reserved_bytes.all().peak, peak);
        }
    }
}

#[test]
fn dormant_segments_are_taken_oldest_first() {
    let d = Dev::new(FIXED);
    // four segments, created in this order: 50, 30, 40, 30 MiB
    let ps: Vec<u64> = [50, 30, 40, 30].iter().map(|&m| d.alloc(m * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    // the stream drained: 25 MiB takes the oldest segment that fits (PyTorch
    // takes a 30 MiB one), then the next oldest
    assert_eq!(d.alloc(25 * MIB), ps[0]);
    assert_eq!(d.alloc(35 * MIB), ps[2]);
    // with blocks out, best fit over the segments in use comes first: the
    // 25 MiB remainder of the 50 MiB segment
    let q = d.alloc(20 * MIB);
    assert_eq!(q, ps[0] + 25 * MIB);
    // nothing in use fits: the oldest dormant segment that does
    assert_eq!(d.alloc(28 * MIB), ps[1]);
    assert_eq!(d.a.stats().num_device_alloc, 4);
    d.check();

    let p = Dev::new("placement:pytorch");
    let qs: Vec<u64> = [50, 30, 40, 30].iter().map(|&m| p.alloc(m * MIB)).collect();
    for &q in &qs {
        p.free(q);
    }
    let got = p.alloc(25 * MIB);
    assert!(
        got == qs[1] || got == qs[3],
        "PyTorch: best fit, a 30 MiB block"
    );
}

#[test]
fn switching_to_pytorch_wakes_dormant_segments() {
    let d = Dev::new(FIXED);
    let ps: Vec<u64> = [50, 30].iter().map(|&m| d.alloc(m * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    d.a.set_config("placement:pytorch").expect("config");
    d.check();
    assert_eq!(d.alloc(25 * MIB), ps[1], "best fit again");
    // empty_cache releases dormant segments like any other
    let d = Dev::new(FIXED);
    let ps: Vec<u64> = [50, 30].iter().map(|&m| d.alloc(m * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    d.a.empty_cache().expect("empty_cache");
    d.check();
    let s = d.a.stats();
    assert_eq!(s.reserved_bytes.all().current, 0);
    assert_eq!(s.num_device_free, 2);
}

#[test]
fn a_bad_placement_is_a_config_error() {
    let err = cachalot_core::AllocatorConfig::parse("placement:first_fit").unwrap_err();
    assert!(err.to_string().contains("placement"), "{err}");
}

/// The cost of the rule where work does not repeat: random programs whose
/// live set keeps draining (each operation frees with probability `pfree`%,
/// else allocates), three runs each. Taking dormant segments oldest first
/// stays within a few percent of PyTorch's best fit in peak reserved (these
/// 20 seeds: −3.3%, +0.3%, +4.7% for pfree 45, 49, 50). Restricting which
/// dormant segments a request may take (at most 2, 4 or 8 times its size)
/// cost up to 3.9×, 2.9× and 1.9× over 40 seeds when tried, so the rule has
/// no such limit.
#[test]
fn drain_heavy_random_programs_stay_near_best_fit() {
    for pfree in [45u64, 49, 50] {
        let mut peak = [0i64; 2];
        for seed in 1..=20 {
            for (k, cfg) in ["placement:pytorch", ""].into_iter().enumerate() {
                let d = Dev::new(cfg);
                let st = [d.s0(), d.stream()];
                for _ in 0..3 {
                    workload(&d, &st, seed, 3000, pfree, false);
                }
                d.check();
                peak[k] += d.a.stats().reserved_bytes.all().peak;
            }
        }
        let ratio = peak[1] as f64 / peak[0] as f64;
        println!("pfree {pfree}: steady / pytorch peak reserved {ratio:.4}");
        assert!(
            ratio < 1.08,
            "pfree {pfree}: steady {ratio:.4}× PyTorch's peak"
        );
    }
}
