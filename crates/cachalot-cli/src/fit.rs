//! "Will it fit?": the smallest simulated device a trace replays on, by
//! bisection, and `cachalot fit`, which asks it for each policy (PyTorch's
//! default and expandable segments, cachalot's default with and without
//! expandable segments).
//!
//! A probe replays the trace (all its passes) on a fresh mock device of the
//! probed size; it fits when no operation fails with out of memory (the
//! allocator's whole retry ladder included: freeing the cache and trying
//! again is part of what a real run would do). The search runs in steps of
//! [`DEFAULT_GRANULARITY`] (2 MiB): every segment the allocator reserves is
//! a multiple of 2 MiB, so a device of `k`·2 MiB + `r` bytes (`r` < 2 MiB)
//! behaves as one of `k`·2 MiB, and the answer is exact, not rounded. The
//! bounds: below the trace's peak allocated bytes nothing fits, and on a
//! device of the peak reserved bytes of an unconstrained replay the same
//! device calls succeed. Between them the search assumes that a larger
//! device never fails where a smaller one fits (the allocator's only
//! capacity-dependent rule, `garbage_collection_threshold`, can break it;
//! the upper bound is then found by doubling, and the answer is still a
//! size that fits).
//!
//! A failure is either too little memory or too little address space: an
//! out-of-memory report with the request's bytes still free on the device
//! ([`Probe::address_space`]). Address space runs out on *larger* devices
//! (PyTorch's expandable segments reserve 1.125x the device per stream and
//! pool, and the mock's address space shrinks past 256 GiB of memory), so
//! where the unconstrained replay fails for it the sizes a trace fits on
//! are an interval below: the search first finds one size inside it
//! (a failure for memory says larger, one for address space smaller), then
//! bisects its lower end as before.

use std::time::Instant;

use cachalot::{AllocatorConfig, DeviceAllocator, ReplayError, Trace};

use crate::run::{allocator_config, config_label, is_no_fit, load_trace};
use crate::{CliError, print_out, units};

/// Step of the bisection: 2 MiB, the allocator's segment granularity.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// The device of an unconstrained replay, and the largest the search
/// probes: 1 TiB, the mock's smallest address space (on a larger mock,
/// expandable segments' address reservations of the device's size no
/// longer fit in it, an artefact of the simulation, not of the policy).
pub const UNCONSTRAINED: u64 = 1 << 40;

/// What one replay on a device of a given size showed.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The trace replayed without running out of memory.
    pub fits: bool,
    /// Peak reserved bytes (over all passes).
    pub peak_reserved: u64,
    /// Peak allocated bytes (rounded block sizes).
    pub peak_allocated: u64,
    /// Peak requested bytes: the trace's own live bytes.
    pub peak_live: u64,
    /// It failed with the request's bytes free on the device: what ran out
    /// was address space (or another limit of the device), not memory, so
    /// a larger device does not help.
    pub address_space: bool,
}

/// Replays `trace` `passes` times on a fresh mock device of `size` bytes
/// with `config`. Running out of memory is an answer (`fits: false`); any
/// other error is a failure naming the operation.
pub fn probe(
    trace: &Trace,
    config: &AllocatorConfig,
    passes: usize,
    size: u64,
) -> Result<Probe, ReplayError> {
    let backend = cachalot::mock::MockConfig::new(size)
        .auto_complete(true)
        .race_checking(false)
        .build();
    let dev = DeviceAllocator::with_mock(backend, Some(config.clone()))
        .map_err(|e| ReplayError::whole(trace, e))?;
    let (fits, address_space) = match dev.replay(trace, passes, |_| {}) {
        Ok(_) => (true, false),
        Err(e) if is_no_fit(&e.source) => (false, not_memory(&e.source)),
        Err(e) => return Err(e),
    };
    let s = dev.stats();
    let peak = |v: i64| v.max(0) as u64;
    Ok(Probe {
        fits,
        peak_reserved: peak(s.reserved_bytes.all().peak),
        peak_allocated: peak(s.allocated_bytes.all().peak),
        peak_live: peak(s.requested_bytes.all().peak),
        address_space,
    })
}

/// Whether an out-of-memory failure happened with the request's bytes free
/// on the device (no memory fraction set): then what ran out was not the
/// device's memory.
fn not_memory(e: &cachalot::Error) -> bool {
    match e {
        cachalot::Error::OutOfMemory(r) => {
            r.allowed.is_none() && r.device_free >= r.segment_size.max(r.rounded)
        }
        _ => false,
    }
}

/// The answer of a bisection.
#[derive(Clone, Debug)]
pub struct Fit {
    /// The smallest device size (a multiple of the granularity) it fits on.
    pub smallest_device: u64,
    /// The unconstrained replay's figures (a device with room to spare);
    /// where that replay ran out of address space, those of the first
    /// device the search found it fits on.
    pub unconstrained: Probe,
    /// Replays the search ran, the unconstrained one included.
    pub replays: usize,
    /// A device size (a multiple of the granularity) on which the replay
    /// ran out of address space: larger devices fail, the answer is the
    /// lower end of an interval. `None`: it fits on [`UNCONSTRAINED`].
    pub address_space_from: Option<u64>,
}

/// The answer of [`smallest_device`].
#[derive(Clone, Debug)]
pub enum Answer {
    /// It fits; the smallest device.
    Fits(Fit),
    /// It fits on no device up to [`UNCONSTRAINED`] bytes; `address_space`:
    /// on the larger ones address space ran out first, on the smaller
    /// memory.
    Never {
        /// Address space, not memory, ran out on the larger devices.
        address_space: bool,
    },
}

impl Answer {
    /// The fit, if any.
    pub fn fit(&self) -> Option<&Fit> {
        match self {
            Answer::Fits(f) => Some(f),
            Answer::Never { .. } => None,
        }
    }

    /// Why it fits on no device, in words (`None` when it fits).
    pub fn never_why(&self) -> Option<String> {
        match self {
            Answer::Fits(_) => None,
            Answer::Never { address_space } => Some(format!(
                "none up to {}{}",
                units::human(UNCONSTRAINED),
                if *address_space {
                    " (address space)"
                } else {
                    ""
                }
            )),
        }
    }
}

/// Failure of a probe as the command reports it.
fn probe_failure(e: ReplayError) -> CliError {
    crate::run::replay_failure(&e.trace.clone(), e)
}

/// The smallest mock device (in steps of `granularity` bytes) on which
/// `trace` replays `passes` times with `config`, or why there is none up
/// to [`UNCONSTRAINED`] bytes.
pub fn smallest_device(
    trace: &Trace,
    config: &AllocatorConfig,
    passes: usize,
    granularity: u64,
) -> Result<Answer, CliError> {
    let unit = granularity.max(1);
    let mut replays = 1;
    let max_k = UNCONSTRAINED / unit;
    let mut run = |k: u64| -> Result<Probe, CliError> {
        replays += 1;
        probe(trace, config, passes, k * unit).map_err(probe_failure)
    };
    let first = probe(trace, config, passes, UNCONSTRAINED).map_err(probe_failure)?;
    // below the peak allocated bytes (of the whole trace, or of the part
    // replayed before a failure) nothing fits
    let floor = |p: &Probe| p.peak_allocated.div_ceil(unit).saturating_sub(1);
    // `base`: a replay that fits, on `top` units; `address_space_from`: a
    // larger size that ran out of address space
    let (base, top, address_space_from) = if first.fits {
        (first, max_k, None)
    } else if !first.address_space {
        return Ok(Answer::Never {
            address_space: false,
        });
    } else {
        // Address space ran out on the largest device: the sizes it fits
        // on, if any, are an interval below. lo fails for memory, hi for
        // address space; a size between them that fits ends the search.
        let (mut lo, mut hi) = (floor(&first).min(max_k - 1), max_k);
        loop {
            if hi - lo <= 1 {
                return Ok(Answer::Never {
                    address_space: true,
                });
            }
            let mid = lo + (hi - lo) / 2;
            let p = run(mid)?;
            if p.fits {
                break (p, mid, Some(hi * unit));
            }
            if p.address_space {
                hi = mid;
            } else {
                lo = mid;
            }
        }
    };
    let mut fits = |k: u64| -> Result<bool, CliError> { Ok(run(k)?.fits) };
    // hi fits; lo does not (below the peak allocated bytes nothing fits)
    let mut hi = base.peak_reserved.div_ceil(unit).clamp(1, top);
    let mut lo = floor(&base).min(hi - 1);
    while !fits(hi)? {
        // a capacity-dependent rule made the figure of the replay on a
        // larger device too small
        lo = hi;
        if hi == top {
            return Ok(Answer::Never {
                address_space: address_space_from.is_some(),
            });
        }
        hi = hi.saturating_mul(2).min(top);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Answer::Fits(Fit {
        smallest_device: hi * unit,
        unconstrained: base,
        replays,
        address_space_from,
    }))
}

/// A policy `cachalot fit` compares.
pub struct Policy {
    /// Short name (in `--json`).
    pub name: &'static str,
    /// What the table calls it.
    pub label: &'static str,
    /// The config keys it sets (over the user's config).
    pub config: &'static str,
}

/// The policies of `cachalot fit`, in table order.
pub const POLICIES: [Policy; 4] = [
    Policy {
        name: "pytorch",
        label: "PyTorch default",
        config: "placement:pytorch,expandable_segments:False",
    },
    Policy {
        name: "pytorch-expandable",
        label: "PyTorch expandable",
        config: "placement:pytorch,expandable_segments:True",
    },
    Policy {
        name: "cachalot-fixed",
        label: "cachalot fixed",
        config: "placement:steady,expandable_segments:False",
    },
    Policy {
        name: "cachalot",
        label: "cachalot default",
        config: "placement:steady,expandable_segments:True",
    },
];

/// One row of the table.
struct Row {
    policy: &'static Policy,
    config: String,
    answer: Answer,
}

/// `cachalot fit`.
pub fn fit_cmd(
    spec: &str,
    config: Option<&str>,
    passes: usize,
    granularity: u64,
    json: bool,
) -> Result<(), CliError> {
    if !(1..=crate::MAX_PASSES as usize).contains(&passes) {
        return Err(CliError::usage(format!(
            "--passes {passes} is outside 1..={}",
            crate::MAX_PASSES
        )));
    }
    let base = allocator_config(config)?;
    let trace = load_trace(spec)?;
    let t0 = Instant::now();
    let mut rows = Vec::new();
    for policy in &POLICIES {
        let text = if base.last_config_string.trim().is_empty() {
            policy.config.to_string()
        } else {
            format!("{},{}", base.last_config_string, policy.config)
        };
        // the base's warnings were printed once already
        let (c, _) = AllocatorConfig::parse_with_warnings(&text)
            .map_err(|e| CliError::usage(e.to_string()))?;
        let answer = smallest_device(&trace, &c, passes, granularity).map_err(|e| CliError {
            message: format!("{} ({}): {}", policy.label, policy.config, e.message),
            ..e
        })?;
        rows.push(Row {
            policy,
            config: text,
            answer,
        });
    }
    let elapsed = t0.elapsed();
    let replays: usize = rows
        .iter()
        .filter_map(|r| r.answer.fit())
        .map(|f| f.replays)
        .sum();
    let mut out = String::new();
    if json {
        for r in &rows {
            let f = r.answer.fit();
            let j = serde_json::json!({
                "trace": trace.name,
                "policy": r.policy.name,
                "config": r.config,
                "passes": passes,
                "granularity": granularity,
                "fits": f.is_some(),
                "smallest_device": f.map(|f| f.smallest_device),
                "peak_reserved": f.map(|f| f.unconstrained.peak_reserved),
                "peak_allocated": f.map(|f| f.unconstrained.peak_allocated),
                "peak_live": f.map(|f| f.unconstrained.peak_live),
                "ratio": f.map(|f| ratio(f.smallest_device, f.unconstrained.peak_live)),
                "replays": f.map(|f| f.replays),
                "address_space_from": f.and_then(|f| f.address_space_from),
                "address_space": matches!(r.answer, Answer::Never { address_space: true })
                    || f.is_some_and(|f| f.address_space_from.is_some()),
            });
            out.push_str(&format!("{j}\n"));
        }
    } else {
        out.push_str(&format!(
            "trace {}: smallest device it replays on ({} pass{}, mock device, {} steps)\n",
            trace.name,
            passes,
            if passes == 1 { "" } else { "es" },
            units::human(granularity)
        ));
        if !base.last_config_string.trim().is_empty() {
            out.push_str(&format!("base config: {}\n", config_label(&base)));
        }
        let header = [
            "policy",
            "smallest device",
            "peak reserved",
            "peak live",
            "device/live",
        ];
        let mut table: Vec<[String; 5]> = vec![header.map(String::from)];
        for r in &rows {
            table.push(match &r.answer {
                Answer::Fits(f) => [
                    r.policy.label.to_string(),
                    units::bytes(f.smallest_device),
                    units::human(f.unconstrained.peak_reserved),
                    units::human(f.unconstrained.peak_live),
                    format!("{:.3}", ratio(f.smallest_device, f.unconstrained.peak_live)),
                ],
                Answer::Never { .. } => [
                    r.policy.label.to_string(),
                    r.answer.never_why().unwrap_or_default(),
                    String::new(),
                    String::new(),
                    String::new(),
                ],
            });
        }
        let widths: Vec<usize> = (0..5)
            .map(|c| {
                table
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for (i, row) in table.iter().enumerate() {
            let mut line = format!("  {:<w$}", row[0], w = widths[0]);
            for c in 1..5 {
                line.push_str(&format!("  {:>w$}", row[c], w = widths[c]));
            }
            out.push_str(line.trim_end());
            out.push('\n');
            if i == 0 {
                let total: usize = widths.iter().sum::<usize>() + 2 * 4;
                out.push_str(&format!("  {}\n", "-".repeat(total)));
            }
        }
        out.push_str(
            "  peak reserved: on a device with room to spare; peak live: the trace's own \
             bytes (requested sizes)\n",
        );
        for r in &rows {
            if let Answer::Never {
                address_space: true,
            } = r.answer
            {
                out.push_str(&format!(
                    "  {}: address space ran out on the larger devices, memory on the smaller\n",
                    r.policy.label
                ));
            }
            if let Some(from) = r.answer.fit().and_then(|f| f.address_space_from) {
                out.push_str(&format!(
                    "  {}: address space runs out first on larger devices (it failed on {}); \
                     its peak reserved is that of a device it fits on\n",
                    r.policy.label,
                    units::human(from)
                ));
            }
        }
        out.push_str(&format!(
            "  {} replays in {:.2} s\n",
            units::group(replays as u64),
            elapsed.as_secs_f64()
        ));
    }
    print_out(&out)
}

fn ratio(device: u64, live: u64) -> f64 {
    if live == 0 {
        0.0
    } else {
        device as f64 / live as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(text: &str) -> Trace {
        Trace::parse("t", text).unwrap()
    }

    /// Two 30 MiB blocks live at once: each takes a 30 MiB segment (large
    /// requests are rounded to 2 MiB), so the smallest device is 60 MiB;
    /// 58 MiB fails and 60 MiB fits, and the bisection finds it exactly.
    #[test]
    fn bisection_finds_the_exact_smallest_device() {
        let t = trace("a 0 31457280 0\na 1 31457280 0\nf 0\nf 1\n");
        let c = AllocatorConfig::parse("expandable_segments:False").unwrap();
        let f = smallest_device(&t, &c, 1, DEFAULT_GRANULARITY)
            .unwrap()
            .fit()
            .cloned()
            .expect("fits");
        assert_eq!(f.smallest_device, 60 << 20);
        assert!(probe(&t, &c, 1, 60 << 20).unwrap().fits);
        assert!(!probe(&t, &c, 1, (60 << 20) - 1).unwrap().fits);
        assert!(!probe(&t, &c, 1, 58 << 20).unwrap().fits);
        assert_eq!(f.unconstrained.peak_live, 60 << 20);
        assert!(f.replays >= 2);
    }

    /// A freed block is released when the cache is emptied on OOM: a device
    /// smaller than the unconstrained peak reserved fits. 10 MiB then 30
    /// MiB, one after the other: unconstrained the 10 MiB segment of the
    /// first stays cached next to the second's 30 MiB (40 MiB reserved),
    /// while a 30 MiB device releases it and fits.
    #[test]
    fn smaller_than_the_unconstrained_peak_reserved() {
        let t = trace("a 0 10485760 0\nf 0\na 1 31457280 0\nf 1\n");
        let c = AllocatorConfig::parse("expandable_segments:False").unwrap();
        let f = smallest_device(&t, &c, 1, DEFAULT_GRANULARITY)
            .unwrap()
            .fit()
            .cloned()
            .expect("fits");
        assert_eq!(f.unconstrained.peak_reserved, 40 << 20);
        assert_eq!(f.smallest_device, 30 << 20);
    }

    /// A request no mock device can hold: no answer, not an error.
    #[test]
    fn never_fits_is_none() {
        let t = trace("a 0 1099511627777 0\n");
        let f = smallest_device(&t, &AllocatorConfig::default(), 1, DEFAULT_GRANULARITY).unwrap();
        assert!(
            matches!(
                f,
                Answer::Never {
                    address_space: false
                }
            ),
            "{f:?}"
        );
    }
}
