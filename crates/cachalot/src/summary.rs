//! `memory_summary()`: the table `torch.cuda.memory_summary()` prints,
//! rendered from the flat statistics.

use std::collections::BTreeMap;

/// PyTorch's `_format_size` of `memory_summary`: scales by the preferred
/// value (the "all" row) and prints `{:6} {prefix}`.
pub fn format_size(sz: i64, pref_sz: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut prefix = PREFIXES[0];
    let mut sz = sz;
    let mut pref = pref_sz as f64;
    for p in &PREFIXES[1..] {
        if pref < 768.0 * 1024.0 {
            break;
        }
        prefix = p;
        sz = sz.div_euclid(1024);
        pref /= 1024.0;
    }
    format!("{sz:6} {prefix}")
}

/// PyTorch's `_format_count` of `memory_summary`: `{:7} {prefix} `.
pub fn format_count(cnt: i64, pref_cnt: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut prefix = PREFIXES[0];
    let mut cnt = cnt;
    let mut pref = pref_cnt as f64;
    for p in &PREFIXES[1..] {
        if pref < 750.0 * 1000.0 {
            break;
        }
        prefix = p;
        cnt = cnt.div_euclid(1000);
        pref /= 1000.0;
    }
    format!("{cnt:7} {prefix} ")
}

/// Words of the summary that name the device kind.
#[derive(Clone, Copy, Debug)]
pub struct SummaryLabels<'a> {
    /// Name in the title ("CUDA" gives "PyTorch CUDA memory summary"-style text).
    pub title: &'a str,
    /// Name before "OOMs" ("CUDA").
    pub oom: &'a str,
    /// Name of the device allocation call ("cudaMalloc").
    pub malloc: &'a str,
}

impl SummaryLabels<'static> {
    /// The labels for a backend name ("cuda", "hip", "level-zero", "mock").
    pub fn for_backend(name: &str) -> Self {
        match name {
            "cuda" => Self {
                title: "cachalot CUDA",
                oom: "CUDA",
                malloc: "cudaMalloc",
            },
            "hip" => Self {
                title: "cachalot HIP",
                oom: "HIP",
                malloc: "hipMalloc",
            },
            "level-zero" => Self {
                title: "cachalot XPU",
                oom: "XPU",
                malloc: "zeMemAlloc",
            },
            _ => Self {
                title: "cachalot mock",
                oom: "Device",
                malloc: "Device malloc",
            },
        }
    }
}

fn pad_to(s: &mut String, width: usize) {
    while s.chars().count() < width {
        s.push(' ');
    }
}

/// Renders the `memory_summary` table from a flat statistics map (missing
/// keys read as 0, so an uninitialized device renders zeros). The layout is
/// PyTorch's, 75 columns between the `|` frames; `abbreviated` leaves out the
/// per-pool lines.
pub fn render(
    stats: &BTreeMap<String, i64>,
    device: u32,
    labels: SummaryLabels<'_>,
    abbreviated: bool,
) -> String {
    let get = |k: &str| stats.get(k).copied().unwrap_or(0);
    let mut lines: Vec<String> = Vec::new();
    lines.push("=".repeat(75));
    // PyTorch: " {_:16} PyTorch CUDA memory summary, device ID {device:<17d} ";
    // the padding shrinks by as much as our labels are longer than PyTorch's.
    let pad = |base: usize, label: &str, pytorch: usize| {
        base.saturating_sub(label.chars().count().saturating_sub(pytorch))
    };
    let mut title = format!(
        " {:w$} {} memory summary, device ID {:<17} ",
        "",
        labels.title,
        device,
        w = pad(16, labels.title, "PyTorch CUDA".len())
    );
    pad_to(&mut title, 75);
    lines.push(title);
    lines.push("-".repeat(75));
    // PyTorch: "  {_:9} CUDA OOMs: {num_ooms:<12d} | {_:6} cudaMalloc retries: {num_alloc_retries:<8d}  "
    let mut oom = format!(
        "  {:w1$} {} OOMs: {:<12} | {:w2$} {} retries: {:<8}  ",
        "",
        labels.oom,
        get("num_ooms"),
        "",
        labels.malloc,
        get("num_alloc_retries"),
        w1 = pad(9, labels.oom, "CUDA".len()),
        w2 = pad(6, labels.malloc, "cudaMalloc".len()),
    );
    pad_to(&mut oom, 75);
    lines.push(oom);
    lines.push("=".repeat(75));
    lines.push(
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    );

    type Fmt = fn(i64, i64) -> String;
    let metrics: [(&str, &str, Fmt); 9] = [
        ("allocated_bytes", "Allocated memory", format_size),
        ("active_bytes", "Active memory", format_size),
        ("requested_bytes", "Requested memory", format_size),
        ("reserved_bytes", "GPU reserved memory", format_size),
        ("inactive_split_bytes", "Non-releasable memory", format_size),
        ("allocation", "Allocations", format_count),
        ("active", "Active allocs", format_count),
        ("segment", "GPU reserved segments", format_count),
        ("inactive_split", "Non-releasable allocs", format_count),
    ];
    for (key, name, f) in metrics {
        lines.push("-".repeat(75));
        let mut subs = vec![("all", name)];
        if !abbreviated {
            subs.push(("large_pool", "      from large pool"));
            subs.push(("small_pool", "      from small pool"));
        }
        let mut pref: Option<[i64; 4]> = None;
        for (sub, label) in subs {
            let prefix = format!("{key}.{sub}.");
            let v = [
                get(&format!("{prefix}current")),
                get(&format!("{prefix}peak")),
                get(&format!("{prefix}allocated")),
                get(&format!("{prefix}freed")),
            ];
            let p = *pref.get_or_insert(v);
            lines.push(format!(
                " {label:<21} | {} | {} | {} | {} ",
                f(v[0], p[0]),
                f(v[1], p[1]),
                f(v[2], p[2]),
                f(v[3], p[3])
            ));
        }
    }
    for (key, name) in [
        ("oversize_allocations", "Oversize allocations"),
        ("oversize_segments", "Oversize GPU segments"),
    ] {
        lines.push("-".repeat(75));
        let v = [
            get(&format!("{key}.current")),
            get(&format!("{key}.peak")),
            get(&format!("{key}.allocated")),
            get(&format!("{key}.freed")),
        ];
        lines.push(format!(
            " {name:<21} | {} | {} | {} | {} ",
            format_count(v[0], v[0]),
            format_count(v[1], v[1]),
            format_count(v[2], v[2]),
            format_count(v[3], v[3])
        ));
    }
    lines.push("=".repeat(75));
    format!("|{}|\n", lines.join("|\n|"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_pytorch() {
        // torch.cuda.memory_summary's _format_size(sz, pref_sz)
        assert_eq!(format_size(0, 0), "     0 B  ");
        assert_eq!(format_size(512, 512), "   512 B  ");
        assert_eq!(format_size(786_431, 786_431), "786431 B  ");
        assert_eq!(format_size(786_432, 786_432), "   768 KiB");
        assert_eq!(format_size(20 << 20, 20 << 20), " 20480 KiB");
        assert_eq!(format_size(768 << 20, 768 << 20), "   768 MiB");
        // Scaled by the "all" value: a small-pool figure in the same unit.
        assert_eq!(format_size(1 << 19, 20 << 20), "   512 KiB");
        assert_eq!(format_size(1 << 19, 768 << 20), "     0 MiB");
        assert_eq!(format_size(3 << 30, 3 << 30), "  3072 MiB");
        assert_eq!(format_size(800 << 30, 800 << 30), "   800 GiB");
        assert_eq!(format_count(0, 0), "      0   ");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
    }

    #[test]
    fn layout_is_75_columns() {
        let flat = cachalot_core::DeviceStats::default().to_flat();
        for labels in ["cuda", "hip", "level-zero", "mock"].map(SummaryLabels::for_backend) {
            let s = render(&flat, 3, labels, false);
            for line in s.lines() {
                assert_eq!(line.chars().count(), 77, "{line:?}");
                assert!(line.starts_with('|') && line.ends_with('|'));
            }
            assert_eq!(s.lines().count(), 6 + 9 * 4 + 2 * 2 + 1);
        }
        let s = render(&flat, 0, SummaryLabels::for_backend("cuda"), true);
        assert!(!s.contains("from large pool"));
    }
}
