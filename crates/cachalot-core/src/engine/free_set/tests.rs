//! The free set against an ordered-set model, and the size classes.

use std::collections::BTreeSet;

use super::FreeSet;
use super::size_tree::{NCLASS, class_of};

/// A small deterministic generator (no dependency on the proptest crate here).
fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 33
}

#[test]
fn size_classes_are_monotone_and_in_range() {
    let mut last = 0;
    for s in (0..1u64 << 22).step_by(512).chain([u64::MAX / 2, u64::MAX]) {
        let c = class_of(s);
        assert!(c >= last, "class of {s} went down");
        assert!(c < NCLASS);
        last = c;
    }
    assert_eq!(class_of(0), class_of(512));
    assert_ne!(class_of(1 << 20), class_of((1 << 20) + (1 << 16)));
}

/// The free set against an ordered set model: random inserts, removals,
/// best-fit takes and lookups, with sizes drawn from a few (to fill one
/// class past the vector-to-tree threshold and back) and from many.
#[test]
fn free_set_matches_an_ordered_set() {
    for (seed, distinct) in [(1u64, 3u64), (2, 40), (3, 5000)] {
        let mut rng = seed;
        let mut set: FreeSet<u8> = FreeSet::default();
        let mut model: BTreeSet<(u8, u64, u64)> = BTreeSet::new();
        let mut next_addr = 0u64;
        for step in 0..20_000u32 {
            let stream = (lcg(&mut rng) % 2) as u8;
            let size = 512 * (1 + lcg(&mut rng) % distinct) * (1 + lcg(&mut rng) % 3);
            match lcg(&mut rng) % 4 {
                0 | 1 => {
                    next_addr += 1 << 20;
                    set.insert(stream, size, next_addr, step, None);
                    model.insert((stream, size, next_addr));
                }
                2 => {
                    let want = model.range((stream, size, 0)..).next().copied();
                    let want = want.filter(|e| e.0 == stream);
                    let got = set.take_first_at_least(stream, size, |_| true);
                    assert_eq!(got.map(|g| (g.size, g.addr)), want.map(|w| (w.1, w.2)));
                    if let Some(w) = want {
                        model.remove(&w);
                    }
                }
                3 if step % 2 == 0 => {
                    // the successor of an entry in (size, address) order
                    if let Some(&e) = model
                        .iter()
                        .nth(lcg(&mut rng) as usize % model.len().max(1))
                    {
                        let want = model
                            .range((e.0, e.1, e.2 + 1)..)
                            .next()
                            .filter(|w| w.0 == e.0)
                            .map(|w| (w.1, w.2));
                        let got = set.next_after(e.0, e.1, e.2).map(|g| (g.size, g.addr));
                        assert_eq!(got, want);
                    }
                }
                _ => {
                    if let Some(&e) = model
                        .iter()
                        .nth(lcg(&mut rng) as usize % model.len().max(1))
                    {
                        assert!(set.get(e.0, e.1, e.2).is_some());
                        assert!(set.remove(e.0, e.1, e.2, None).is_some());
                        assert!(set.remove(e.0, e.1, e.2, None).is_none());
                        model.remove(&e);
                    }
                }
            }
            assert_eq!(set.len(), model.len());
        }
        let all: Vec<_> = set.iter().map(|e| (e.stream, e.size, e.addr)).collect();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}

/// Handing the sets out to shards and taking them back keeps every block
/// and the stream order, with streams new to a shard, sets emptied there
/// and shards not held: the order of (stream, size, address) is the one
/// before, plus what the shards added.
#[test]
fn sets_handed_out_come_back_in_stream_order() {
    const SHARDS: usize = 5;
    for seed in 1..60u64 {
        let mut rng = seed;
        let mut home: FreeSet<u16> = FreeSet::default();
        let mut model: BTreeSet<(u16, u64, u64)> = BTreeSet::new();
        let mut addr = 0u64;
        let mut add = |set: &mut FreeSet<u16>, model: &mut BTreeSet<_>, s: u16, rng: &mut u64| {
            addr += 1 << 20;
            let size = 512 * (1 + lcg(rng) % 8);
            set.insert(s, size, addr, (addr >> 20) as u32, None);
            model.insert((s, size, addr));
        };
        for s in 0..(1 + lcg(&mut rng) % 40) as u16 {
            for _ in 0..lcg(&mut rng) % 3 {
                add(&mut home, &mut model, s * 4, &mut rng);
            }
        }
        let mut shards: Vec<FreeSet<u16>> = (0..SHARDS).map(|_| FreeSet::default()).collect();
        // stream → shard as a router does it: by a hash, in no stream order
        let route = |s: u16| (usize::from(s) * 7 + 3) % SHARDS;
        {
            let mut to: Vec<Option<&mut FreeSet<u16>>> = shards.iter_mut().map(Some).collect();
            home.hand_out(&mut to, route);
        }
        assert_eq!(home.len(), 0);
        for (k, sh) in shards.iter_mut().enumerate() {
            // each shard's sets arrive in stream order
            assert!(sh.streams().collect::<Vec<_>>().is_sorted());
            // the shard's own work: blocks taken, streams new to it
            for _ in 0..lcg(&mut rng) % 4 {
                let streams: Vec<u16> = sh.streams().collect();
                if let Some(&s) = streams.get(lcg(&mut rng) as usize % streams.len().max(1))
                    && let Some(f) = sh.take_first_at_least(s, 0, |_| true)
                {
                    assert!(model.remove(&(s, f.size, f.addr)));
                }
            }
            for _ in 0..lcg(&mut rng) % 3 {
                // a stream of this shard not seen before (odd: none of home's)
                let s = (lcg(&mut rng) % 200) as u16 * 2 + 1;
                if route(s) == k {
                    add(sh, &mut model, s, &mut rng);
                }
            }
        }
        {
            let mut from: Vec<Option<&mut FreeSet<u16>>> = shards.iter_mut().map(Some).collect();
            home.take_back(&mut from);
        }
        assert!(home.streams().collect::<Vec<_>>().is_sorted());
        assert_eq!(home.len(), model.len());
        let all: Vec<_> = home.iter().map(|e| (e.stream, e.size, e.addr)).collect();
        assert_eq!(all, model.iter().copied().collect::<Vec<_>>());
        assert!(
            shards
                .iter()
                .all(|sh| sh.len() == 0 && sh.streams().next().is_none())
        );
    }
}
