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
/// (PyTorch's `roundup_power2_next_division`).
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size { size } else { down + step }
}

/// PyTorch's `round_size`: the block size a request of `size` bytes gets.
#[inline]
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = config.divisions_for(size);
    if d > 1 && size > MIN_BLOCK_SIZE * d {
        return roundup_power2_next_division(size, d);
    }
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// PyTorch's `get_allocation_size`: the segment size for a miss of a block of
/// `rounded` bytes.
#[inline]
pub fn allocation_size(rounded: u64, config: &AllocatorConfig) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
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
}
