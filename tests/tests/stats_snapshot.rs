//! The statistics agree with the snapshot they describe, as PyTorch's
//! `memory_stats()` agrees with `memory_snapshot()`, in the default
//! configuration (expandable segments, cachalot's placement) and with
//! PyTorch's placement: after random allocations of every size class,
//! frees and `empty_cache`.

use cachalot_conformance::mock::{Dev, MIB};
use cachalot_core::engine::{BlockState, Snapshot};

#[derive(Debug, Default, PartialEq, Eq)]
struct Figures {
    segment: i64,
    reserved_bytes: i64,
    allocation: i64,
    allocated_bytes: i64,
    active: i64,
    active_bytes: i64,
    requested_bytes: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
}

/// What the statistics should say, counted from the snapshot as PyTorch's
/// own consistency tests count them: a free block of a segment that holds
/// other blocks is an inactive split; except that the mapped ranges of an
/// expandable segment, reported as segments, enter neither the `segment`
/// nor the inactive-split statistics (as in PyTorch's expandable mode).
fn from_snapshot(s: &Snapshot) -> Figures {
    let mut f = Figures::default();
    for seg in &s.segments {
        f.segment += i64::from(!seg.is_expandable);
        f.reserved_bytes += seg.total_size as i64;
        assert_eq!(
            seg.blocks.iter().map(|b| b.size).sum::<u64>(),
            seg.total_size
        );
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                f.allocation += 1;
                f.allocated_bytes += b.size as i64;
            }
            if b.state != BlockState::Inactive {
                f.active += 1;
                f.active_bytes += b.size as i64;
                f.requested_bytes += b.requested_size as i64;
            } else if seg.blocks.len() > 1 && !seg.is_expandable {
                f.inactive_split += 1;
                f.inactive_split_bytes += b.size as i64;
            }
        }
    }
    f
}

fn from_stats(d: &Dev) -> Figures {
    let st = d.a.stats();
    Figures {
        segment: st.segment.all().current,
        reserved_bytes: st.reserved_bytes.all().current,
        allocation: st.allocation.all().current,
        allocated_bytes: st.allocated_bytes.all().current,
        active: st.active.all().current,
        active_bytes: st.active_bytes.all().current,
        requested_bytes: st.requested_bytes.all().current,
        inactive_split: st.inactive_split.all().current,
        inactive_split_bytes: st.inactive_split_bytes.all().current,
    }
}

fn random_walk(config: &str) {
    let d = Dev::new(config);
    let mut live: Vec<u64> = Vec::new();
    let mut x: u64 = 7;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let sizes = [
        1,
        100,
        511,
        513,
        4000,
        70_000,
        1_100_000,
        3 * MIB,
        11 * MIB,
        25 * MIB,
    ];
    for step in 0..600 {
        let r = next() % 100;
        if r < 55 || live.is_empty() {
            live.push(d.alloc(sizes[(next() % sizes.len() as u64) as usize]));
        } else if r < 95 {
            let i = (next() % live.len() as u64) as usize;
            d.free(live.swap_remove(i));
        } else {
            d.a.empty_cache().unwrap();
        }
        if step % 5 == 0 {
            assert_eq!(
                from_stats(&d),
                from_snapshot(&d.a.snapshot()),
                "{config}: step {step}"
            );
        }
    }
    for p in live.drain(..) {
        d.free(p);
    }
    d.a.empty_cache().unwrap();
    assert_eq!(
        from_stats(&d),
        from_snapshot(&d.a.snapshot()),
        "{config}: at the end"
    );
}

#[test]
fn stats_agree_with_the_snapshot_in_the_default_configuration() {
    random_walk("");
}

#[test]
fn stats_agree_with_the_snapshot_with_pytorchs_placement() {
    random_walk("placement:pytorch");
}

#[test]
fn stats_agree_with_the_snapshot_with_fixed_segments() {
    random_walk("expandable_segments:False");
}

#[test]
fn a_free_block_keeps_its_last_requested_size_as_pytorchs_does() {
    for config in ["", "placement:pytorch", "expandable_segments:False"] {
        let d = Dev::new(config);
        let p = d.alloc(65_536);
        let q = d.alloc(70_000);
        d.free(p);
        let s = d.a.snapshot();
        let b = s
            .segments
            .iter()
            .flat_map(|g| &g.blocks)
            .find(|b| b.address == p)
            .expect("the freed block");
        assert_eq!(b.state, BlockState::Inactive, "{config}");
        assert_eq!(b.requested_size, 65_536, "{config}: the last request");
        // the segment's requested bytes count active blocks only
        let seg = s
            .segments
            .iter()
            .find(|g| g.blocks.iter().any(|b| b.address == q))
            .unwrap();
        assert_eq!(seg.requested_size, 70_000, "{config}");
        d.free(q);
        assert_eq!(d.a.stats().requested_bytes.all().current, 0, "{config}");
    }
}
