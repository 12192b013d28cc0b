//! `cargo xtask fuzz` and `cargo xtask miri`.
//!
//! `fuzz` builds the libFuzzer targets of `fuzz/` (its own workspace) with
//! the nightly toolchain and the flags `cargo fuzz` uses (sanitizer
//! coverage, AddressSanitizer, debug assertions), so `cargo-fuzz` need not
//! be installed, then runs each target for the given time on
//! `fuzz/corpus/<target>` (grown, not committed) plus the committed
//! `fuzz/seeds/<target>` and `fuzz/regressions/<target>`, and reports the
//! executions. A crash is minimized and copied into
//! `fuzz/regressions/<target>/`, which the owning crate's `cargo test`
//! replays through the same harness.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::{Res, root};

/// The fuzz targets, in the order `cargo xtask fuzz` runs them.
pub const TARGETS: &[&str] = &["trace", "config", "engine", "pools", "capi"];

/// Packages `cargo xtask miri` runs under Miri (their FFI-free tests; the
/// tests that call into a real C library or spawn processes are marked
/// `#[cfg_attr(miri, ignore)]`).
pub const MIRI_PACKAGES: &[&str] = &[
    "cachalot-capi",
    "cachalot-hip-sys",
    "cachalot-level-zero-sys",
    "cachalot-hip",
    "cachalot-level-zero",
];

const HOST: &str = "x86_64-unknown-linux-gnu";

const FUZZ_USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--no-asan] [target]
  runs every target (trace, config, engine, pools, capi), or the one named,
  for N seconds each (default 60) and reports the executions";

/// The toolchain both commands use.
fn nightly() -> Command {
    let mut c = Command::new("rustup");
    c.args(["run", "nightly", "cargo"]);
    // a stable cargo running xtask exports its toolchain; +nightly must win
    c.env_remove("RUSTUP_TOOLCHAIN");
    c.env_remove("CARGO");
    c.env_remove("RUSTC");
    c
}

/// `cargo xtask fuzz [--seconds N] [--no-asan] [target]`.
pub fn fuzz(args: &[String]) -> Res<bool> {
    let mut seconds = 60u64;
    let mut asan = true;
    let mut only: Option<String> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => {
                let v = it
                    .next()
                    .ok_or(format!("--seconds needs a value\n{FUZZ_USAGE}"))?;
                seconds = v
                    .parse()
                    .ok()
                    .filter(|&s| s > 0)
                    .ok_or(format!("--seconds {v}: expected a positive integer"))?;
            }
            "--no-asan" => asan = false,
            "-h" | "--help" => {
                println!("{FUZZ_USAGE}");
                return Ok(true);
            }
            t if TARGETS.contains(&t) && only.is_none() => only = Some(t.to_string()),
            other => return Err(format!("fuzz: unexpected argument {other}\n{FUZZ_USAGE}")),
        }
    }
    let targets: Vec<&str> = match &only {
        Some(t) => vec![t.as_str()],
        None => TARGETS.to_vec(),
    };
    let dir = root().join("fuzz");
    build(&dir, asan)?;
    let bin_dir = dir.join("target").join(HOST).join("release");
    let mut ok = true;
    let mut rows = Vec::new();
    for t in &targets {
        let r = run_target(&dir, &bin_dir, t, seconds)?;
        ok &= r.crash.is_none();
        rows.push((t.to_string(), r));
    }
    println!("\nfuzz summary ({seconds} s per target):");
    println!(
        "  {:<8} {:>12} {:>8} {:>10} {:>8}  result",
        "target", "executions", "seconds", "exec/s", "corpus"
    );
    for (t, r) in &rows {
        let result = match &r.crash {
            None => "ok".to_string(),
            Some(p) => format!("CRASH -> {}", p.display()),
        };
        println!(
            "  {:<8} {:>12} {:>8} {:>10} {:>8}  {result}",
            t,
            r.execs,
            r.secs,
            r.execs.checked_div(r.secs.max(1)).unwrap_or(0),
            r.corpus
        );
    }
    if !ok {
        println!(
            "crash inputs were copied into fuzz/regressions/<target>/: `cargo test` replays \
             them; fix the bug, then commit the input"
        );
    }
    Ok(ok)
}

fn build(dir: &Path, asan: bool) -> Res<()> {
    let mut flags = vec![
        "-Cpasses=sancov-module",
        "-Cllvm-args=-sanitizer-coverage-level=4",
        "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
        "-Cllvm-args=-sanitizer-coverage-pc-table",
        "-Cllvm-args=-sanitizer-coverage-trace-compares",
        "--cfg=fuzzing",
        "-Cdebug-assertions",
        "-Coverflow-checks",
        "-Cforce-frame-pointers",
    ];
    if asan {
        flags.push("-Zsanitizer=address");
    }
    println!(
        "xtask: building the fuzz targets (nightly{})",
        if asan { ", ASan" } else { "" }
    );
    let status = nightly()
        .current_dir(dir)
        .env("RUSTFLAGS", flags.join(" "))
        // the targets are run from the fuzz workspace's own target dir
        .env_remove("CARGO_TARGET_DIR")
        // --target: the flags apply to the targets, not to build scripts
        // and proc macros
        .args(["build", "--release", "--bins", "--target", HOST])
        .status()
        .map_err(|e| {
            format!("running cargo +nightly (is the nightly toolchain installed?): {e}")
        })?;
    if !status.success() {
        return Err(
            "building the fuzz targets failed (needs `rustup toolchain install nightly`)".into(),
        );
    }
    Ok(())
}

struct Outcome {
    execs: u64,
    secs: u64,
    corpus: usize,
    crash: Option<PathBuf>,
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn run_target(dir: &Path, bin_dir: &Path, target: &str, seconds: u64) -> Res<Outcome> {
    let corpus = dir.join("corpus").join(target);
    let artifacts = dir.join("artifacts").join(target);
    for d in [&corpus, &artifacts] {
        fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let before = files_in(&artifacts);
    let mut cmd = Command::new(bin_dir.join(target));
    cmd.current_dir(dir)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .args(["-rss_limit_mb=2048", "-timeout=30", "-print_final_stats=1"]);
    let dict = dir.join("dict").join(format!("{target}.dict"));
    if dict.exists() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    cmd.arg(&corpus);
    for extra in ["seeds", "regressions"] {
        let d = dir.join(extra).join(target);
        if d.is_dir() {
            cmd.arg(d);
        }
    }
    println!("\nxtask: fuzzing {target} for {seconds} s");
    let t0 = Instant::now();
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("running {}: {e}", bin_dir.join(target).display()))?;
    let mut execs = 0u64;
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
                execs = v.trim().parse().unwrap_or(execs);
            } else if let Some(rest) = line.strip_prefix("Done ") {
                execs = rest
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(execs);
            }
            // the per-input lines (NEW, REDUCE) are noise here
            if !(line.contains("\tNEW ") || line.contains("\tREDUCE ")) {
                println!("  {line}");
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {target}: {e}"))?;
    let secs = t0.elapsed().as_secs();
    let new: Vec<PathBuf> = files_in(&artifacts)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    let crash = if status.success() && new.is_empty() {
        None
    } else {
        let Some(found) = new.first() else {
            return Err(format!("{target} failed ({status}) without a crash input"));
        };
        Some(keep_crash(dir, bin_dir, target, found)?)
    };
    Ok(Outcome {
        execs,
        secs,
        corpus: files_in(&corpus).len(),
        crash,
    })
}

/// Minimizes a crash input (briefly) and copies it into
/// `fuzz/regressions/<target>/`; returns where.
fn keep_crash(dir: &Path, bin_dir: &Path, target: &str, found: &Path) -> Res<PathBuf> {
    let name = found
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "crash".into());
    let minimized = found.with_extension("min");
    let _ = Command::new(bin_dir.join(target))
        .current_dir(dir)
        .args(["-minimize_crash=1", "-max_total_time=60"])
        .arg(format!("-exact_artifact_path={}", minimized.display()))
        .arg(found)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let src = if minimized.exists() {
        minimized
    } else {
        found.to_path_buf()
    };
    let dest_dir = dir.join("regressions").join(target);
    fs::create_dir_all(&dest_dir).map_err(|e| format!("creating {}: {e}", dest_dir.display()))?;
    let dest = dest_dir.join(name);
    fs::copy(&src, &dest).map_err(|e| format!("copying {}: {e}", src.display()))?;
    Ok(dest)
}

/// `cargo xtask miri`: the Miri tests of [`MIRI_PACKAGES`], one package at
/// a time, with Miri's leak check on (its default) and isolation off.
pub fn miri(args: &[String]) -> Res<bool> {
    if let Some(a) = args.first() {
        return Err(format!(
            "miri: unexpected argument {a}\nusage: cargo xtask miri"
        ));
    }
    let mut ok = true;
    let mut rows = Vec::new();
    for p in MIRI_PACKAGES {
        println!("\nxtask: cargo +nightly miri test -p {p}");
        // Isolation off: the tests read the committed fuzz inputs and the
        // environment; everything else is Miri's default (leak check on).
        let flags = std::env::var("MIRIFLAGS").unwrap_or_default();
        let status = nightly()
            .current_dir(root())
            .env("MIRIFLAGS", format!("{flags} -Zmiri-disable-isolation"))
            .args(["miri", "test", "-p", p])
            .status()
            .map_err(|e| {
                format!("running cargo +nightly miri (`rustup +nightly component add miri`): {e}")
            })?;
        ok &= status.success();
        rows.push((p, status.success()));
    }
    println!("\nmiri summary:");
    for (p, good) in rows {
        println!("  {p:<26} {}", if good { "ok" } else { "FAILED" });
    }
    Ok(ok)
}
