//! A tiny deterministic pseudo-random generator (splitmix64) for the
//! benchmarks' workloads, the mock device's simulated delays and the
//! tests: the same seed gives the same sequence on every machine, with no
//! dependency.

/// splitmix64 (Steele, Lea and Flood, 2014): one `u64` of state, every
/// seed valid.
///
/// ```
/// use cachalot_core::rng::SplitMix64;
/// let mut a = SplitMix64::new(7);
/// let mut b = SplitMix64::new(7);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator at `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next number of the sequence.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (0 when `n` is 0), by multiplication rather than
    /// a remainder.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn the_reference_sequence() {
        // splitmix64's published outputs for seed 0
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn below_and_unit_stay_in_range() {
        let mut r = SplitMix64::new(42);
        for n in [0, 1, 2, 7, 1 << 40, u64::MAX] {
            for _ in 0..1000 {
                let x = r.below(n);
                assert!(x < n.max(1), "{x} of {n}");
            }
        }
        for _ in 0..1000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
