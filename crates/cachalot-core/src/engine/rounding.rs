//! Size rounding and segment sizing (spec 2.1, 2.2, 2.4).

use crate::config::AllocatorConfig;

/// Rounding quantum and minimum block size.
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small requests.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests in (1 MiB, 10 MiB) get a `large_segment_size` segment.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of segment sizes ≥ 10 MiB.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Requests of at least this many bytes can never be served (PyTorch's 1 EiB guard).
pub const MAX_REQUEST: u64 = 1 << 60;

/// The next multiple of `2^floor(log2 size) / divisions` at or above `size`
/// (PyTorch's `roundup_power2_next_division`). Total: 0 stays 0, 0
/// divisions count as 1, and a result past `u64::MAX` saturates there (the
/// engine only rounds requests below [`MAX_REQUEST`], whose results fit).
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size == 0 || size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.max(1).leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down.saturating_add(step)
    }
}

/// PyTorch's `round_size`: the block size a request of `size` bytes gets.
/// Total over every size and configuration (no overflow: a result past
/// `u64::MAX` saturates there; requests the engine serves are below
/// [`MAX_REQUEST`] and their results fit).
#[inline]
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = config.divisions_for(size);
    // `size > 512·d`, where a product past u64::MAX is larger than any size.
    if d > 1 && MIN_BLOCK_SIZE.checked_mul(d).is_some_and(|m| size > m) {
        return roundup_power2_next_division(size, d);
    }
    size.div_ceil(MIN_BLOCK_SIZE).saturating_mul(MIN_BLOCK_SIZE)
}

/// PyTorch's `get_allocation_size`: the segment size for a miss of a block of
/// `rounded` bytes. Total (saturates at `u64::MAX`, as [`round_size`]).
#[inline]
pub fn allocation_size(rounded: u64, config: &AllocatorConfig) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    fn r(c: &str, s: u64) -> u64 {
        round_size(s, &AllocatorConfig::parse(c).unwrap())
    }

    #[test]
    fn default_rounding_table() {
        for (s, want) in [
            (1, 512),
            (511, 512),
            (513, 1024),
            (1000, 1024),
            (MIB - 1, MIB),
            (MIB + 1, 1049088),
        ] {
            assert_eq!(r("", s), want, "size {s}");
        }
    }

    #[test]
    fn power2_divisions_tables() {
        for (s, want) in [
            (1200, 1536),
            (2048, 2048),
            (2049, 2560),
            (3000, 3072),
            (1200000, 1310720),
            (5000000, 5242880),
            (4194304, 4194304),
        ] {
            assert_eq!(r("roundup_power2_divisions:4", s), want, "size {s}");
        }
        let c = "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]";
        assert_eq!(r(c, 300 * MIB + 1), 300 * MIB + 512);
        assert_eq!(r(c, 600 * MIB + 1), 768 * MIB);
        assert_eq!(r(c, 1536 * MIB + 1), 1792 * MIB);
        assert_eq!(r(c, 3072 * MIB + 1), 3328 * MIB);
        let c = "roundup_power2_divisions:[1:2,>:8]";
        assert_eq!(r(c, 1200000), 3 * MIB / 2);
        assert_eq!(r(c, 3 * MIB + 1), 3 * MIB + MIB / 4);
        assert_eq!(r(c, 5 * MIB + 1), 5 * MIB + MIB / 2);
    }

    #[test]
    fn segment_sizes() {
        let c = AllocatorConfig::default();
        let seg = |s: u64| allocation_size(round_size(s, &c), &c);
        assert_eq!(seg(1), 2 * MIB);
        assert_eq!(seg(MIB), 2 * MIB);
        assert_eq!(seg(MIB + 1), 20 * MIB);
        assert_eq!(seg(10 * MIB - 512), 20 * MIB);
        assert_eq!(seg(10 * MIB - 1), 10 * MIB);
        assert_eq!(seg(10 * MIB), 10 * MIB);
        assert_eq!(seg(10 * MIB + 1), 12 * MIB);
        assert_eq!(seg(20 * MIB + 1), 22 * MIB);
        assert_eq!(seg(100 * MIB + 1), 102 * MIB);
    }

    /// Sizes at the edges: near `MAX_REQUEST`, near `u64::MAX`, powers of two
    /// and their neighbours. (Debug builds check overflow: an overflow fails.)
    fn extreme_sizes() -> Vec<u64> {
        let mut v = vec![0, 1, 511, 512, 513, u64::MAX, u64::MAX - 1, u64::MAX - 511];
        for k in [9, 20, 21, 30, 35, 40, 59, 60, 61, 62, 63] {
            let p = 1u64 << k;
            v.extend([p - 1, p, p + 1]);
        }
        v.extend([
            MAX_REQUEST - 1,
            MAX_REQUEST - 512,
            MAX_REQUEST - 2 * MIB - 1,
        ]);
        v
    }

    /// Configurations at the edges: the parser's largest values, and values
    /// past what it accepts set directly (the engine must not trust them).
    fn extreme_configs() -> Vec<AllocatorConfig> {
        use crate::config::{MAX_ROUNDUP_DIVISIONS, MAX_SIZE_MB};
        let mut v = vec![
            AllocatorConfig::default(),
            AllocatorConfig::parse(&format!(
                "roundup_power2_divisions:{MAX_ROUNDUP_DIVISIONS},large_segment_size_mb:{MAX_SIZE_MB},\
                 max_split_size_mb:{MAX_SIZE_MB},max_non_split_rounding_mb:{MAX_SIZE_MB}"
            ))
            .unwrap(),
            AllocatorConfig::parse(&format!(
                "roundup_power2_divisions:[1:2,{MAX_SIZE_MB}:{MAX_ROUNDUP_DIVISIONS},>:{MAX_ROUNDUP_DIVISIONS}]"
            ))
            .unwrap(),
        ];
        for d in [2, 1 << 54, 1 << 55, 1 << 62, 1 << 63, u64::MAX] {
            v.push(AllocatorConfig {
                roundup_power2_divisions: [d; 16],
                large_segment_size: u64::MAX,
                ..AllocatorConfig::default()
            });
        }
        v
    }

    #[test]
    fn extreme_values_never_overflow() {
        for c in extreme_configs() {
            for s in extreme_sizes() {
                let r = round_size(s, &c);
                assert!(r >= s.max(MIN_BLOCK_SIZE), "{s} -> {r}");
                let a = allocation_size(r, &c);
                assert!(a >= r.min(c.large_segment_size), "{s} -> {r} -> {a}");
                if s > 0 && s < MAX_REQUEST {
                    // what the engine serves: exact, and within 2x (+ a quantum)
                    assert!(r <= s.saturating_mul(2).max(MIN_BLOCK_SIZE), "{s} -> {r}");
                    assert!(a >= r, "{s} -> {r} -> {a}");
                }
            }
        }
        // the hostile value of issue 17, had it got past the parser
        let c = AllocatorConfig {
            roundup_power2_divisions: [9223372036854775808; 16],
            ..AllocatorConfig::default()
        };
        assert_eq!(round_size(MAX_REQUEST - 1, &c), MAX_REQUEST);
        for d in [0, 1, 2, 1 << 63, u64::MAX] {
            for s in extreme_sizes() {
                let r = roundup_power2_next_division(s, d);
                assert!(r >= s, "{s}/{d} -> {r}");
            }
        }
        assert_eq!(roundup_power2_next_division(0, 4), 0);
        assert_eq!(roundup_power2_next_division((1 << 63) + 1, 1), u64::MAX);
        assert_eq!(roundup_power2_next_division(u64::MAX - 1, 2), u64::MAX);
        assert_eq!(round_size(u64::MAX, &AllocatorConfig::default()), u64::MAX);
        assert_eq!(
            allocation_size(u64::MAX - 1, &AllocatorConfig::default()),
            u64::MAX
        );
        // in range the results are exact multiples
        let c = AllocatorConfig::default();
        assert_eq!(round_size(MAX_REQUEST - 1, &c), MAX_REQUEST);
        assert_eq!(allocation_size(MAX_REQUEST - 1, &c), MAX_REQUEST);
    }
}
