//! Which shard serves an operation: the stream → shard [`Router`] (on the
//! device), the thread-local hints a fast operation tries first (the
//! stream's shard, the shard of an address this thread allocated), this
//! thread's token, and the per-thread path counts.

use std::cell::Cell;
use std::hash::{Hash, Hasher};

use super::SHARDS;

/// FNV-1a over a stream's `Hash`: the key of the thread-local shard hint.
pub(crate) fn stream_key<S: Hash>(alloc: u64, s: &S) -> u64 {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = (self.0 ^ n)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
        }
        fn write_u32(&mut self, n: u32) {
            self.write_u64(n as u64);
        }
        fn write_u16(&mut self, n: u16) {
            self.write_u64(n as u64);
        }
        fn write_u8(&mut self, n: u8) {
            self.write_u64(n as u64);
        }
        fn write_usize(&mut self, n: usize) {
            self.write_u64(n as u64);
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325 ^ alloc.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    s.hash(&mut h);
    h.finish() | 1
}

/// [`count_path`]: an operation served on its shard alone.
pub(crate) const FAST: usize = 0;
/// [`count_path`]: an operation served on the device path.
pub(crate) const DEVICE: usize = 1;
/// [`count_path`]: a full stat log taken out (`flush_logs`).
pub(crate) const FLUSH: usize = 2;

/// A thread-local of the engine: std's, or under the `shuttle` feature
/// the model's (each model thread its own), from one declaration.
macro_rules! engine_thread_local {
    ($(#[$m:meta])* $vis:vis static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(feature = "shuttle"))]
        thread_local! {
            $(#[$m])* $vis static $name: $t = const { $init };
        }
        #[cfg(feature = "shuttle")]
        shuttle::thread_local! {
            $(#[$m])* $vis static $name: $t = $init;
        }
    };
}

engine_thread_local! {
    /// How this thread's operations were served (cheap thread-local
    /// counters, always on): see [`crate::engine::PathCounts`].
    pub(crate) static PATHS: Cell<[u64; 3]> = Cell::new([0; 3]);
}

/// Counts one event of kind `i` ([`FAST`], [`DEVICE`], [`FLUSH`]).
#[inline(always)]
pub(crate) fn count_path(i: usize) {
    PATHS.with(|c| {
        let mut v = c.get();
        v[i] += 1;
        c.set(v);
    });
}

engine_thread_local! {
    /// This thread's token for [`SharedMirror`](super::SharedMirror)
    /// ownership (0 until first asked for).
    static TOKEN: Cell<u64> = Cell::new(0);
}

/// This thread's token: unique among the process's threads, never 0.
#[inline(always)]
pub(crate) fn thread_token() -> u64 {
    TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            return v;
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let v = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        t.set(v);
        v
    })
}

/// Entries of the thread-local hint.
pub(crate) const HINTS: usize = 4;

engine_thread_local! {
    /// The shards this thread used last, as (stream key, shard), most
    /// recent first. Only a guess: the shard checks that it holds the
    /// stream (a wrong guess is a miss, served by the device).
    static HINT: [Cell<(u64, u32)>; HINTS] = [const { Cell::new((0, 0)) }; HINTS];
}

/// The shard the hint gives for `key`.
#[inline]
pub(crate) fn hint_get(key: u64) -> Option<usize> {
    HINT.with(|h| {
        h.iter().find_map(|c| {
            let (k, s) = c.get();
            (k == key).then_some(s as usize)
        })
    })
}

/// The shard this thread used `i`-th last (for a free, which names no
/// stream).
#[inline]
pub(crate) fn hint_shard(i: usize) -> Option<usize> {
    HINT.with(|h| {
        let (k, s) = h[i % HINTS].get();
        (k != 0).then_some(s as usize)
    })
}

/// Records that `key`'s stream is on `shard`, most recent first.
pub(crate) fn hint_set(key: u64, shard: usize) {
    HINT.with(|h| {
        let at = h.iter().position(|c| c.get().0 == key).unwrap_or(HINTS - 1);
        for i in (1..=at).rev() {
            h[i].set(h[i - 1].get());
        }
        h[0].set((key, shard as u32));
    });
}

/// Entries of the thread-local owner cache (a power of two).
const OWNERS: usize = 1024;

engine_thread_local! {
    /// The shards of this thread's recent allocations, as (address,
    /// shard), direct-mapped by a hash of the address: a free of an
    /// address this thread allocated tries its shard first. Only a guess,
    /// as [`HINT`] (the shard checks that it holds the address).
    static OWNER: [Cell<(u64, u32)>; OWNERS] = [const { Cell::new((0, 0)) }; OWNERS];
}

/// The slot of `addr` in [`OWNER`].
#[inline(always)]
fn owner_slot(addr: u64) -> usize {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - OWNERS.trailing_zeros())) as usize
}

/// Records that this thread's allocation at `addr` is on `shard`.
#[inline]
pub(crate) fn owner_set(addr: u64, shard: usize) {
    OWNER.with(|o| o[owner_slot(addr)].set((addr, shard as u32)));
}

/// The shard of this thread's allocation at `addr`, if remembered.
#[inline]
pub(crate) fn owner_get(addr: u64) -> Option<usize> {
    OWNER.with(|o| {
        let (a, k) = o[owner_slot(addr)].get();
        (a == addr).then_some(k as usize)
    })
}

/// Stream → shard, assigned round-robin as streams first appear (on the
/// device; the fast path uses the thread-local hint).
pub(crate) struct Router<S> {
    map: Vec<(S, u32)>,
    next: u32,
}

impl<S> Default for Router<S> {
    fn default() -> Self {
        Self {
            map: Vec::new(),
            next: 0,
        }
    }
}

impl<S: Copy + Ord> Router<S> {
    /// The shard of `s`, assigned now if `s` is new.
    #[inline]
    pub fn shard(&mut self, s: S) -> usize {
        match self.map.binary_search_by(|e| e.0.cmp(&s)) {
            Ok(i) => self.map[i].1 as usize,
            Err(i) => {
                let k = self.next;
                self.next = (self.next + 1) % SHARDS as u32;
                self.map.insert(i, (s, k));
                k as usize
            }
        }
    }

    /// [`Router::shard`] for streams asked in increasing order: `at`
    /// (0 before the first) walks along the router's streams, so a walk
    /// over n streams costs O(n + streams known) instead of O(n log n).
    /// Streams new to the router are assigned as [`Router::shard`] assigns
    /// them.
    #[inline]
    pub fn shard_from(&mut self, s: S, at: &mut usize) -> usize {
        debug_assert!(*at == 0 || self.map[*at - 1].0 < s, "streams in order");
        while let Some(e) = self.map.get(*at)
            && e.0 < s
        {
            *at += 1;
        }
        match self.map.get(*at) {
            Some(e) if e.0 == s => e.1 as usize,
            _ => {
                let k = self.next;
                self.next = (self.next + 1) % SHARDS as u32;
                self.map.insert(*at, (s, k));
                k as usize
            }
        }
    }

    /// The shard of `s` if assigned.
    #[inline]
    pub fn get(&self, s: S) -> Option<usize> {
        self.map
            .binary_search_by(|e| e.0.cmp(&s))
            .ok()
            .map(|i| self.map[i].1 as usize)
    }
}
