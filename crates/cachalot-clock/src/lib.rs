//! # cachalot-clock
//!
//! The time stamp of cachalot's stat logs (`cachalot-core`'s
//! `engine/stat_log.rs`): a cheap reading of a clock shared by every
//! thread, ordered with the memory operations around it. A stamp taken
//! after a thread has seen another thread's stamp (through any
//! synchronization: an atomic, a lock, a barrier) is at least that stamp,
//! which is what lets the engine merge its shards' logs in real-time order
//! and keep exact peaks.
//!
//! Two sources, chosen once per process ([`source`]):
//!
//! - [`Source::Tsc`] (x86_64, where the time-stamp counter is invariant
//!   and the kernel keeps it as its clock): `lfence; rdtsc`. The fence
//!   makes the read wait for every earlier instruction (the load that saw
//!   the other thread's stamp included), and an invariant TSC ticks at one
//!   rate on every core, synchronized by the kernel. A few nanoseconds,
//!   against 32-45 for the monotonic clock on the H200's host (a virtual
//!   machine), at every thread count.
//! - [`Source::Monotonic`] (everywhere else, or when asked for with
//!   [`prefer`]): nanoseconds of [`std::time::Instant`] since the first
//!   stamp.
//!
//! The stamps of the two sources are in different units (TSC ticks,
//! nanoseconds) and never mixed: the source is fixed at the first stamp.
//! Only their order means something.
//!
//! This crate is the one place in cachalot's engine where `unsafe` is
//! allowed outside a backend's FFI boundary: the TSC read in [`tsc`], with
//! its `SAFETY:` comment. The engine itself (`cachalot-core`) stays
//! `#![forbid(unsafe_code)]`.
#![deny(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

/// Where the stamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The invariant time-stamp counter, read behind an `lfence` (x86_64).
    Tsc,
    /// The monotonic clock ([`Instant`]), in nanoseconds.
    Monotonic,
}

impl Source {
    /// The name `cachalot threads --clock` takes and prints.
    pub fn name(self) -> &'static str {
        match self {
            Source::Tsc => "tsc",
            Source::Monotonic => "monotonic",
        }
    }
}

/// [`prefer`] came too late: the source was already fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlreadyChosen(pub Source);

impl std::fmt::Display for AlreadyChosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the clock source is already {} (it is fixed at the first time stamp)",
            self.0.name()
        )
    }
}

impl std::error::Error for AlreadyChosen {}

/// The source: 0 not chosen yet, else `1 + Source as u8`.
static CHOSEN: AtomicU8 = AtomicU8::new(0);
const TSC: u8 = 1;
const MONOTONIC: u8 = 2;

/// The source of this process's stamps; chosen at the first call (of this,
/// [`stamp`] or [`prefer`]) and fixed from then on: the TSC where
/// [`tsc_usable`] says so, else the monotonic clock.
pub fn source() -> Source {
    match CHOSEN.load(Ordering::Relaxed) {
        TSC => Source::Tsc,
        MONOTONIC => Source::Monotonic,
        _ => choose(if tsc_usable() {
            Source::Tsc
        } else {
            Source::Monotonic
        }),
    }
}

/// Fixes the source before the first stamp: [`Source::Monotonic`] always
/// takes; [`Source::Tsc`] only where [`tsc_usable`] (else the monotonic
/// clock). Returns the source now in force; `Err` when the source was
/// already fixed as another one.
pub fn prefer(want: Source) -> Result<Source, AlreadyChosen> {
    let want = match want {
        Source::Tsc if !tsc_usable() => Source::Monotonic,
        w => w,
    };
    let got = choose(want);
    if got == want {
        Ok(got)
    } else {
        Err(AlreadyChosen(got))
    }
}

/// The TSC at the first choice of the TSC: stamps count from it, so they
/// stay small (a stamp is a merge key's upper 59 bits in the engine), and
/// it is set once, before the source is published.
static TSC_BASE: OnceLock<u64> = OnceLock::new();

/// Sets the source to `want` unless one is set; returns the one in force.
#[cold]
fn choose(want: Source) -> Source {
    let code = match want {
        Source::Tsc => {
            TSC_BASE.get_or_init(tsc::read);
            TSC
        }
        Source::Monotonic => {
            monotonic();
            MONOTONIC
        }
    };
    // Release: a thread that sees the source sees its base
    match CHOSEN.compare_exchange(0, code, Ordering::Release, Ordering::Acquire) {
        Ok(_) => want,
        Err(TSC) => Source::Tsc,
        Err(_) => Source::Monotonic,
    }
}

/// Whether this machine's TSC can order stamps across threads: x86_64, an
/// invariant TSC (CPUID leaf 0x8000_0007, EDX bit 8: one rate in every
/// power state, on every core), and, on Linux, the kernel's clock source
/// is `tsc` (the kernel checked that the cores' counters are synchronized;
/// it moves off `tsc` when they are not). Asked once.
pub fn tsc_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| tsc::invariant() && kernel_keeps_tsc())
}

/// On Linux, whether the kernel's current clock source is the TSC (when
/// the file cannot be read, true: the CPUID bit decides alone).
fn kernel_keeps_tsc() -> bool {
    if !cfg!(target_os = "linux") {
        return true;
    }
    match std::fs::read_to_string(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
    ) {
        Ok(s) => s.trim() == "tsc",
        Err(_) => true,
    }
}

/// A time stamp of the process's [`source`], counted from its first
/// reading, plus one (never 0): TSC ticks or nanoseconds. A stamp read
/// after this thread observed another thread's stamp is at least that
/// stamp.
#[inline]
pub fn stamp() -> u64 {
    stamp_with(tsc::read)
}

/// A [`stamp`] without the fence: the same units and origin, a few cycles
/// cheaper, but the read may run before earlier instructions have
/// completed, so it orders nothing across threads. For times that are only
/// shown (the memory history's entries, as PyTorch's
/// `getApproximateTime`), never for the stat logs' order.
#[inline]
pub fn approximate() -> u64 {
    stamp_with(tsc::read_unfenced)
}

/// A stamp of the chosen source, the TSC read by `read` (fenced or not).
#[inline(always)]
fn stamp_with(read: fn() -> u64) -> u64 {
    match CHOSEN.load(Ordering::Acquire) {
        TSC => {
            let base = TSC_BASE.get().copied().unwrap_or(0);
            read().saturating_sub(base) + 1
        }
        MONOTONIC => monotonic(),
        _ => {
            source();
            stamp_with(read)
        }
    }
}

/// Nanoseconds of the monotonic clock since the first such stamp, plus one.
#[inline]
pub fn monotonic() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    base.elapsed().as_nanos() as u64 + 1
}

/// The TSC: the only `unsafe` code of the engine outside the backends'
/// FFI (issue 39's rule): `lfence; rdtsc`, x86_64 only; and the CPUID
/// query of its invariance.
#[allow(unsafe_code)]
pub mod tsc {
    /// Whether the CPU has an invariant TSC (CPUID leaf 0x8000_0007, EDX
    /// bit 8); false on other architectures.
    pub fn invariant() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::__cpuid;
            // (a safe intrinsic: CPUID exists on every x86_64 CPU) leaf
            // 0x8000_0000 gives the highest extended leaf, so leaf
            // 0x8000_0007 is asked only where it exists
            if __cpuid(0x8000_0000).eax < 0x8000_0007 {
                return false;
            }
            __cpuid(0x8000_0007).edx & (1 << 8) != 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// `lfence; rdtsc`: the TSC, read after every earlier instruction has
    /// completed (so after the load that observed another thread's stamp;
    /// a stamp published by a store that depends on its value cannot be
    /// seen before it was read).
    /// On other architectures the monotonic clock ([`super::monotonic`]).
    /// Meaningful across threads only where [`super::tsc_usable`].
    #[inline]
    pub fn read() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_mm_lfence, _rdtsc};
            // SAFETY: LFENCE (SSE2, part of the x86_64 baseline) and RDTSC
            // (every x86_64 CPU; no OS sets CR4.TSD for user code on the
            // platforms cachalot runs on) read no memory and write only
            // registers. The fence waits for every earlier instruction to
            // complete locally before RDTSC reads the counter.
            unsafe {
                _mm_lfence();
                _rdtsc()
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            super::monotonic()
        }
    }

    /// `rdtsc` alone: the TSC without waiting for earlier instructions
    /// (see [`super::approximate`]). On other architectures the monotonic
    /// clock.
    #[inline]
    pub fn read_unfenced() -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::_rdtsc;
            // SAFETY: RDTSC (every x86_64 CPU; no OS sets CR4.TSD for user
            // code on the platforms cachalot runs on) reads no memory and
            // writes only registers.
            unsafe { _rdtsc() }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            super::monotonic()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::AtomicU64;

    /// `threads` threads, `rounds` times each: read the largest stamp
    /// published so far, take a stamp, check it is at least the one read,
    /// publish it. A stamp taken after seeing another thread's must not be
    /// below it.
    fn ordered_across_threads(read: fn() -> u64, threads: usize, rounds: u32) {
        let shared = AtomicU64::new(0);
        let bar = Barrier::new(threads);
        std::thread::scope(|sc| {
            for _ in 0..threads {
                sc.spawn(|| {
                    bar.wait();
                    let mut last = 0;
                    for i in 0..rounds {
                        let seen = shared.load(Ordering::Acquire);
                        let t = read();
                        assert!(
                            t >= seen,
                            "round {i}: stamp {t} below {seen}, seen before it"
                        );
                        assert!(t >= last, "round {i}: stamp {t} below this thread's {last}");
                        last = t;
                        shared.fetch_max(t, Ordering::AcqRel);
                    }
                });
            }
        });
        assert!(shared.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn the_tsc_is_ordered_across_threads() {
        if !tsc_usable() {
            eprintln!("no invariant TSC kept by the kernel here: the TSC test is skipped");
            return;
        }
        ordered_across_threads(tsc::read, 4, 200_000);
    }

    #[test]
    fn the_monotonic_clock_is_ordered_across_threads() {
        ordered_across_threads(monotonic, 4, 50_000);
    }

    #[test]
    fn the_chosen_source_is_ordered_across_threads() {
        ordered_across_threads(stamp, 4, 100_000);
        // fixed once chosen
        let s = source();
        assert_eq!(source(), s);
        let other = match s {
            Source::Tsc => Source::Monotonic,
            Source::Monotonic if tsc_usable() => Source::Tsc,
            Source::Monotonic => return,
        };
        assert_eq!(prefer(other), Err(AlreadyChosen(s)));
        assert_eq!(prefer(s), Ok(s));
    }

    #[test]
    fn stamps_are_never_zero_and_never_go_back_on_one_thread() {
        let mut last = 0;
        for _ in 0..100_000 {
            let t = stamp();
            assert!(t > 0 && t >= last);
            last = t;
        }
    }

    #[test]
    fn approximate_reads_are_in_the_stamps_units_and_origin() {
        for _ in 0..10_000 {
            let before = stamp();
            let a = approximate();
            let after = stamp();
            // the fenced read after waits for the unfenced one; the one
            // before may be passed by a few hundred cycles at most
            assert!(a > 0 && a <= after, "{a} after {after}");
            assert!(a + 1_000_000 >= before, "{a} long before {before}");
        }
    }

    #[test]
    fn the_invariant_bit_matches_the_kernels_flag() {
        // Linux sets `nonstop_tsc` from the same CPUID bit
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        if !cfg!(target_arch = "x86_64") {
            assert!(!tsc::invariant());
            return;
        }
        let flag = info.split_whitespace().any(|w| w == "nonstop_tsc");
        assert_eq!(tsc::invariant(), flag);
    }
}
