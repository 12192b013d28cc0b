//! Byte sizes on the command line: parsing `24GiB`, `24GB`, `512MiB` or a
//! plain byte count (bounded), and printing sizes with thousands
//! separators.

/// Smallest `--device-memory`: 1 MiB (a smaller device holds no segment).
pub const MIN_DEVICE_MEMORY: u64 = 1 << 20;
/// Largest `--device-memory`: the mock's largest capacity (4 TiB).
pub const MAX_DEVICE_MEMORY: u64 = cachalot::MAX_MOCK_MEMORY;

/// The units a size may carry (case-insensitive), with their factors.
/// `K`, `M`, `G`, `T` alone are binary, as `nvidia-smi` and PyTorch's
/// messages count memory.
const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("kb", 1_000),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("mb", 1_000_000),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("gb", 1_000_000_000),
    ("t", 1 << 40),
    ("tib", 1 << 40),
    ("tb", 1_000_000_000_000),
];

/// Parses a byte size: a number (digits, at most one `.`; `,` and `_`
/// group digits) and an optional unit (`B`, `KiB`, `MiB`, `GiB`, `TiB`,
/// their decimal `KB` ... `TB`, or `K`/`M`/`G`/`T` for the binary ones),
/// in `[min, max]`. Fractions of a byte are dropped. The error names the
/// value and what is allowed.
pub fn parse_size(s: &str, min: u64, max: u64) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != ',' && c != '_').collect();
    let unit = unit.trim().to_ascii_lowercase();
    let allowed = format!(
        "a size such as 24GiB, 24GB, 512MiB or a byte count, from {} to {}",
        human(min),
        human(max)
    );
    let bad = || {
        format!(
            "'{}' is not a size: expected {allowed}",
            cachalot::core::config::echo(s)
        )
    };
    let factor = UNITS
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, f)| *f)
        .ok_or_else(bad)?;
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let (int, frac) = num.split_once('.').unwrap_or((&num, ""));
    let out_of_range = || {
        format!(
            "{} is out of range: expected {allowed}",
            cachalot::core::config::echo(s)
        )
    };
    // integer part × factor, exactly, then the fraction's bytes
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| out_of_range())?
    };
    let mut bytes = int
        .checked_mul(u128::from(factor))
        .ok_or_else(out_of_range)?;
    if !frac.is_empty() {
        // at most 18 fractional digits matter for a factor up to 2^40
        let digits = &frac[..frac.len().min(18)];
        let f: u128 = digits.parse().map_err(|_| bad())?;
        bytes += f * u128::from(factor) / 10u128.pow(digits.len() as u32);
    }
    match u64::try_from(bytes) {
        Ok(b) if (min..=max).contains(&b) => Ok(b),
        _ => Err(out_of_range()),
    }
}

/// `--device-memory`'s parser for clap.
pub fn device_memory(s: &str) -> Result<u64, String> {
    parse_size(s, MIN_DEVICE_MEMORY, MAX_DEVICE_MEMORY)
}

/// `n` with a comma every three digits: `8,082,423,808`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// [`group`] of a signed value (statistics are `i64`).
pub fn group_i(n: i64) -> String {
    if n < 0 {
        format!("-{}", group(n.unsigned_abs()))
    } else {
        group(n as u64)
    }
}

/// `n` bytes in the largest binary unit it reaches, two decimals:
/// `7.53 GiB`, `512.00 KiB`, `100 B`.
pub fn human(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (unit, f) in UNITS {
        if n >= f {
            return format!("{:.2} {unit}", n as f64 / f as f64);
        }
    }
    format!("{n} B")
}

/// `8,082,423,808 B (7.53 GiB)`; below 1 KiB just `100 B`.
pub fn bytes(n: u64) -> String {
    if n < 1 << 10 {
        format!("{n} B")
    } else {
        format!("{} B ({})", group(n), human(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = MAX_DEVICE_MEMORY;

    #[test]
    fn sizes_parse_in_every_unit() {
        for (s, want) in [
            ("24GiB", 24u64 << 30),
            ("24 GiB", 24 << 30),
            ("24gib", 24 << 30),
            ("24G", 24 << 30),
            ("24GB", 24_000_000_000),
            ("24gb", 24_000_000_000),
            ("512MiB", 512 << 20),
            ("512mb", 512_000_000),
            ("1.5GiB", 3 << 29),
            ("0.5TiB", 1 << 39),
            ("4TiB", 4 << 40),
            ("150754820096", 150_754_820_096),
            ("150,754,820,096", 150_754_820_096),
            ("150_754_820_096 B", 150_754_820_096),
            ("  80GB ", 80_000_000_000),
            ("1048576", 1 << 20),
            (".5GiB", 1 << 29),
            ("2048KiB", 2 << 20),
        ] {
            assert_eq!(parse_size(s, 1, MAX), Ok(want), "{s}");
        }
        // a fraction of a byte is dropped
        assert_eq!(parse_size("1.0000000001KiB", 1, MAX), Ok(1024));
    }

    #[test]
    fn garbage_and_out_of_range_are_errors_naming_the_value() {
        for s in [
            "", "GiB", "lots", "24 GiBs", "24XB", "1.2.3GiB", ".", "-1GiB", "1e9", "nan",
            "24 G iB", "0x100",
        ] {
            let e = parse_size(s, 1, MAX).expect_err(s);
            assert!(e.contains("not a size") && e.contains("24GiB"), "{s}: {e}");
        }
        for s in [
            "5TiB",
            "4398046511105",
            "18446744073709551616",
            "99999999999999999999999999999999999999999",
            "17179869184GiB",
        ] {
            let e = parse_size(s, 1, MAX).expect_err(s);
            assert!(
                e.contains("out of range") && e.contains("4.00 TiB"),
                "{s}: {e}"
            );
        }
        let e = device_memory("1000").unwrap_err();
        assert!(e.contains("1.00 MiB"), "{e}");
        assert_eq!(device_memory("1MiB"), Ok(MIN_DEVICE_MEMORY));
        // a long value is cut in the message
        let e = parse_size(&"9x".repeat(10_000), 1, MAX).unwrap_err();
        assert!(e.len() < 300, "{}", e.len());
    }

    #[test]
    fn formatting() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(350_000), "350,000");
        assert_eq!(group(8_082_423_808), "8,082,423,808");
        assert_eq!(group(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(group_i(-1234), "-1,234");
        assert_eq!(group_i(i64::MIN), "-9,223,372,036,854,775,808");
        assert_eq!(human(100), "100 B");
        assert_eq!(human(8_082_423_808), "7.53 GiB");
        assert_eq!(human(24 << 30), "24.00 GiB");
        assert_eq!(bytes(8_082_423_808), "8,082,423,808 B (7.53 GiB)");
        assert_eq!(bytes(512), "512 B");
    }
}
