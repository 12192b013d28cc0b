//! The values of config entries: booleans, bounded integers and floats,
//! sizes, and the errors that name what a key allows.

use super::{MAX_ROUNDUP_DIVISIONS, MAX_SIZE_MB, MIB, echo};
use crate::error::{ConfigError, ConfigErrorKind};

pub(super) fn invalid(key: &str, value: &str, reason: String) -> ConfigError {
    ConfigError::new(
        key,
        ConfigErrorKind::InvalidValue { value: echo(value) },
        reason,
    )
}

/// A value outside `allowed`; the reason is `what` and the range.
pub(super) fn out_of_range(key: &str, value: &str, allowed: &str, what: String) -> ConfigError {
    ConfigError::new(
        key,
        ConfigErrorKind::OutOfRange {
            value: echo(value),
            allowed: allowed.to_string(),
        },
        format!("{what} (allowed: {allowed})"),
    )
}

pub(super) fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(
            key,
            v,
            format!("Expected 'True' or 'False', got '{}'", echo(v)),
        )),
    }
}

/// An integer in `[min, max]`. Digits that do not fit a `u64`, and a
/// negative integer, are out of range; anything else not an integer is an
/// invalid value.
pub(super) fn int_in(
    key: &str,
    v: &str,
    min: u64,
    max: u64,
    allowed: &str,
) -> Result<u64, ConfigError> {
    let digits = v.strip_prefix(['-', '+']).unwrap_or(v);
    let n = match v.parse::<u64>() {
        Ok(n) => n,
        Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            return Err(out_of_range(
                key,
                v,
                allowed,
                format!("{} is out of range", echo(v)),
            ));
        }
        Err(_) => {
            return Err(invalid(
                key,
                v,
                format!("expected a non-negative integer, got '{}'", echo(v)),
            ));
        }
    };
    if n < min {
        return Err(out_of_range(
            key,
            v,
            allowed,
            format!("{n} is too small, must be >= {min}"),
        ));
    }
    if n > max {
        return Err(out_of_range(
            key,
            v,
            allowed,
            format!("{n} is too large, must be <= {max}"),
        ));
    }
    Ok(n)
}

/// A finite number accepted by `ok`.
pub(super) fn float_in(
    key: &str,
    v: &str,
    ok: impl Fn(f64) -> bool,
    allowed: &str,
) -> Result<f64, ConfigError> {
    let x = v
        .parse::<f64>()
        .map_err(|_| invalid(key, v, format!("expected a number, got '{}'", echo(v))))?;
    if !x.is_finite() || !ok(x) {
        return Err(out_of_range(
            key,
            v,
            allowed,
            format!("{} is out of range", echo(v)),
        ));
    }
    Ok(x)
}

/// A size in MiB in `[min_mb, MAX_SIZE_MB]`, as bytes.
pub(super) fn size_mb(key: &str, v: &str, min_mb: u64) -> Result<u64, ConfigError> {
    let allowed = format!("[{min_mb}, {MAX_SIZE_MB}] MiB");
    Ok(int_in(key, v, min_mb, MAX_SIZE_MB, &allowed)? * MIB)
}

/// A `roundup_power2_divisions` value: 0 or a power of two ≤ [`MAX_ROUNDUP_DIVISIONS`].
pub(super) fn divisions(key: &str, v: &str) -> Result<u64, ConfigError> {
    let allowed = format!("0 or a power of two <= {MAX_ROUNDUP_DIVISIONS}");
    let n = int_in(key, v, 0, MAX_ROUNDUP_DIVISIONS, &allowed)?;
    if n != 0 && !n.is_power_of_two() {
        return Err(out_of_range(
            key,
            v,
            &allowed,
            format!("For roundups, the divisions has to be power of 2, got {n}"),
        ));
    }
    Ok(n)
}

/// A `roundup_power2_divisions` list boundary (MiB): a power of two ≤ [`MAX_SIZE_MB`].
pub(super) fn boundary(key: &str, v: &str) -> Result<u64, ConfigError> {
    let allowed = format!("a power of two <= {MAX_SIZE_MB} (MiB), or '>'");
    let n = int_in(key, v, 1, MAX_SIZE_MB, &allowed)?;
    if !n.is_power_of_two() {
        return Err(out_of_range(
            key,
            v,
            &allowed,
            format!("For roundups, the intervals have to be power of 2, got {n}"),
        ));
    }
    Ok(n)
}

/// A boolean key cachalot does not act on: `False` (the default, what
/// cachalot does) is accepted, `True` is a typed "not supported" error
/// saying why; never accepted and ignored.
pub(super) fn not_yet(key: &str, v: &str, why: &str) -> Result<bool, ConfigError> {
    if parse_bool(key, v)? {
        return Err(unsupported(key, v, why));
    }
    Ok(false)
}

/// The typed "not supported" error of `expandable_segments:True` on a
/// backend without virtual-memory management.
pub(crate) fn expandable_unsupported() -> ConfigError {
    unsupported(
        "expandable_segments",
        "True",
        "the backend has no virtual-memory management",
    )
}

/// The typed "not supported" error of `key:v`.
pub(super) fn unsupported(key: &str, v: &str, why: &str) -> ConfigError {
    ConfigError::new(
        key,
        ConfigErrorKind::Unsupported {
            value: v.to_string(),
        },
        format!("'{key}:{}' is not supported: {why}", echo(v)),
    )
}
