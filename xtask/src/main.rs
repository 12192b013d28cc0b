//! Build automation for cachalot (`cargo xtask <command>`).
//!
//! * `test-cuda`: with a usable GPU, runs the CUDA test packages and prints a
//!   pass/fail summary; without one, builds the release test and bench
//!   binaries and packs them into `dist/cuda/` with a `run.sh` that runs them
//!   on a GPU machine (no Rust needed there; the cudarc example
//!   `examples/mlp-train` goes to `dist/cuda/cudarc/`, run by
//!   `scripts/device/cudarc_example.sh`), then runs them again under
//!   `compute-sanitizer --tool memcheck --leak-check full` (API errors the
//!   tests provoke on purpose are listed in `sanitizer-allow.txt`).
//!   Wherever the tests run on the hardware (here or through `run.sh`),
//!   `CACHALOT_REQUIRE_GPU=1` turns every "skipped: ..." into a failure.
//!   It also packs the C ABI's cdylib (`cachalot-capi`, release, CUDA
//!   compiled in) as `dist/cuda/lib/libcachalot_capi.so`, which the PyTorch
//!   shim (`python/cachalot_torch/`, `python/run_gpu_suite.sh`) loads, the
//!   traces (`traces/`) and every other file the tests read (fuzz seeds
//!   and regressions, proptest's saved cases: `repo/`, under their paths
//!   in the repository; see `PACKED_REPO_PATHS`).
//! * `test-hip`, `test-level-zero`: the same for HIP (AMD, device node
//!   `/dev/kfd`) and Level Zero (Intel, a `/dev/dri/renderD*` node), packing
//!   into `dist/hip/` and `dist/level-zero/`. Without hardware the tests still
//!   run here first: they exercise the "library present or absent, no device"
//!   paths and print `skipped: <reason>`.
//! * `bench-cuda`: packs the release bench and CLI binaries, the
//!   repository's PyTorch harnesses (`bench/pytorch/`: a trace replay and a
//!   thread-scaling benchmark against PyTorch's own C++
//!   `CUDACachingAllocator`, built there with g++) and the traces into
//!   `dist/cuda/` with a `bench.sh` that builds and runs everything and
//!   prints the tables.
//! * `fuzz [--seconds N] [--no-asan] [target]`: builds the libFuzzer targets
//!   of `fuzz/` with nightly and runs each (or the one named) for N seconds
//!   (default 60), reporting executions; crash inputs land in
//!   `fuzz/regressions/<target>/`, which `cargo test` replays.
//! * `miri`: `cargo +nightly miri test` on the C ABI and the HIP and Level
//!   Zero crates (their fake driver tables).

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use serde_json::Value;

mod fuzz;

/// Packages whose tests need a GPU, with the feature (if any) that turns
/// their CUDA tests on. A package absent from the workspace, or lacking the
/// feature, is skipped, so later packages can be listed before they exist.
const CUDA_TEST_PACKAGES: &[(&str, Option<&str>)] = &[
    ("cachalot-cuda", None),
    ("cachalot-conformance", Some("cuda")),
    // the stat logs' clock: its stamps ordered across the GPU host's cores
    ("cachalot-clock", None),
];

/// Packages whose tests exercise the HIP backend (same rules as above).
const HIP_TEST_PACKAGES: &[(&str, Option<&str>)] = &[
    ("cachalot-hip-sys", None),
    ("cachalot-hip", None),
    ("cachalot-conformance", Some("hip")),
];

/// Packages whose tests exercise the Level Zero backend.
const LEVEL_ZERO_TEST_PACKAGES: &[(&str, Option<&str>)] = &[
    ("cachalot-level-zero-sys", None),
    ("cachalot-level-zero", None),
    ("cachalot-conformance", Some("level-zero")),
];

/// Packages whose bench targets are packed (same rules as above).
const CUDA_BENCH_PACKAGES: &[(&str, Option<&str>)] = &[
    ("cachalot-cuda", None),
    ("cachalot", Some("cuda")),
    ("cachalot-conformance", Some("cuda")),
];

/// The cudarc workload (`examples/mlp-train`): `test-cuda` packs its
/// binary and test binaries into `dist/cuda/cudarc/`, which
/// `scripts/device/cudarc_example.sh` runs (it makes cuBLAS and NVRTC
/// loadable first, which `run.sh` does not).
const CUDARC_EXAMPLE: (&str, &str) = ("mlp-train", "mlp-train");

/// CLI binaries packed by `bench-cuda`: (package, binary, feature).
const CLI_BINARIES: &[(&str, &str, Option<&str>)] = &[("cachalot-cli", "cachalot", Some("cuda"))];

/// The repository's PyTorch harnesses (`bench/pytorch/`), packed into
/// `dist/cuda/pytorch/`, where `bench.sh` builds them with `build.sh`:
/// (file name, text, executable).
const PYTORCH_HARNESS: &[(&str, &str, bool)] = &[
    (
        "build.sh",
        include_str!("../../bench/pytorch/build.sh"),
        true,
    ),
    (
        "bench_common.h",
        include_str!("../../bench/pytorch/bench_common.h"),
        false,
    ),
    (
        "torch_replay.cpp",
        include_str!("../../bench/pytorch/torch_replay.cpp"),
        false,
    ),
    (
        "torch_threads.cpp",
        include_str!("../../bench/pytorch/torch_threads.cpp"),
        false,
    ),
];

/// What the packed test binaries read from the repository, besides the
/// traces (packed as `traces/`, found through `$CACHALOT_TRACES`): copied
/// into the pack's `repo/` under the same paths, which `run.sh` names in
/// `$CACHALOT_REPO_ROOT` (`cachalot_conformance::repo_root`). A folder is
/// copied whole; `dir/*.ext` copies the files of `dir` ending in `.ext`.
/// The test `packed_tests_read_only_what_is_packed` checks the test sources
/// against this list.
const PACKED_REPO_PATHS: &[&str] = &[
    // the committed fuzz inputs that `fuzz_regressions` replays
    "fuzz/seeds",
    "fuzz/regressions",
    // proptest's saved failing cases, replayed first
    "tests/tests/*.proptest-regressions",
];

const RUN_SH: &str = include_str!("run.sh");
/// Driver API errors the CUDA tests provoke on purpose (run.sh's sanitizer run).
const SANITIZER_ALLOW: &str = include_str!("sanitizer-allow.txt");
const BENCH_SH: &str = include_str!("bench.sh");

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  test-cuda    run the CUDA tests when a GPU is present; otherwise build the
               release test and bench binaries into dist/cuda/ with run.sh
  test-hip     the same for HIP (AMD GPUs); packs into dist/hip/
  test-level-zero
               the same for Level Zero (Intel GPUs); packs into dist/level-zero/
  bench-cuda   pack release bench/CLI binaries, the PyTorch harnesses of
               bench/pytorch/ and the traces into dist/cuda/ with bench.sh
  fuzz [--seconds N] [--no-asan] [target]
               build the libFuzzer targets of fuzz/ (nightly) and run each
               (trace, config, engine, pools, capi) for N seconds (default 60)
  miri         cargo +nightly miri test on cachalot-capi and the HIP and
               Level Zero crates

options:
  --pack       (test-cuda) pack even when a GPU is present
  --no-strip   keep debug info in packed binaries
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    if matches!(cmd.as_str(), "fuzz" | "miri") {
        let result = if cmd == "fuzz" {
            fuzz::fuzz(&args[1..])
        } else {
            fuzz::miri(&args[1..])
        };
        return match result {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("xtask: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let opts = Options {
        pack: args.iter().any(|a| a == "--pack"),
        strip: !args.iter().any(|a| a == "--no-strip"),
    };
    if let Some(bad) = args[1..]
        .iter()
        .find(|a| !matches!(a.as_str(), "--pack" | "--no-strip"))
    {
        eprintln!("xtask: unknown option {bad}\n{USAGE}");
        return ExitCode::from(2);
    }
    let result = match cmd.as_str() {
        "test-cuda" => test_cuda(&opts),
        "test-hip" => test_vendor(&opts, "hip", HIP_TEST_PACKAGES, amd_gpu_present()),
        "test-level-zero" => test_vendor(
            &opts,
            "level-zero",
            LEVEL_ZERO_TEST_PACKAGES,
            intel_gpu_present(),
        ),
        "bench-cuda" => bench_cuda(&opts),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(true)
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    pack: bool,
    strip: bool,
}

type Res<T> = Result<T, String>;

fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// One workspace package as `cargo metadata` describes it.
struct Package {
    name: String,
    manifest: String,
    features: Vec<String>,
    /// (kind, name) of every target.
    targets: Vec<(String, String)>,
}

impl Package {
    fn has_kind(&self, kind: &str) -> bool {
        self.targets.iter().any(|(k, _)| k == kind)
    }
}

fn metadata() -> Res<Vec<Package>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err("cargo metadata failed".into());
    }
    let v: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata output: {e}"))?;
    let pkgs = v["packages"].as_array().cloned().unwrap_or_default();
    Ok(pkgs
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            manifest: p["manifest_path"].as_str().unwrap_or_default().to_string(),
            features: p["features"]
                .as_object()
                .map(|f| f.keys().cloned().collect())
                .unwrap_or_default(),
            targets: p["targets"]
                .as_array()
                .map(|ts| {
                    ts.iter()
                        .flat_map(|t| {
                            let name = t["name"].as_str().unwrap_or_default().to_string();
                            t["kind"]
                                .as_array()
                                .cloned()
                                .unwrap_or_default()
                                .into_iter()
                                .map(move |k| {
                                    (k.as_str().unwrap_or_default().to_string(), name.clone())
                                })
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// The (package, feature) pairs of `wanted` present in the workspace.
fn select<'a>(
    pkgs: &'a [Package],
    wanted: &[(&str, Option<&str>)],
) -> Vec<(&'a Package, Option<String>)> {
    let mut out = Vec::new();
    for (name, feature) in wanted {
        let Some(p) = pkgs.iter().find(|p| p.name == *name) else {
            println!("xtask: package {name} not in the workspace, skipped");
            continue;
        };
        match feature {
            Some(f) if !p.features.iter().any(|x| x == f) => {
                println!("xtask: package {name} has no feature `{f}`, skipped");
            }
            Some(f) => out.push((p, Some((*f).to_string()))),
            None => out.push((p, None)),
        }
    }
    out
}

fn feature_args(cmd: &mut Command, pkg: &Package, feature: &Option<String>) {
    cmd.args(["-p", &pkg.name]);
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
}

/// [`feature_args`] for a test build: a package built for one vendor's
/// feature leaves its default features (the other vendors) out, so that
/// its binaries hold no test that must skip on this vendor's machine
/// (a failure under `CACHALOT_REQUIRE_GPU=1`).
fn test_feature_args(cmd: &mut Command, pkg: &Package, feature: &Option<String>) {
    feature_args(cmd, pkg, feature);
    if feature.is_some() {
        cmd.arg("--no-default-features");
    }
}

/// Whether the CUDA probe finds a usable device (libcuda loads, count > 0).
fn gpu_present() -> bool {
    let status = cargo()
        .args([
            "run",
            "-q",
            "--release",
            "-p",
            "cachalot-cuda",
            "--example",
            "cuda_probe",
        ])
        .status();
    matches!(status, Ok(s) if s.success())
}

/// Builds the release test binaries of `selected` and copies them into
/// `dist/tests/` (emptied first); returns how many.
fn pack_tests(
    pkgs: &[Package],
    selected: &[(&Package, Option<String>)],
    dist: &Path,
    opts: &Options,
) -> Res<usize> {
    let tests_dir = dist.join("tests");
    reset_dir(&tests_dir)?;
    let mut n = 0;
    for (pkg, feature) in selected {
        let mut cmd = cargo();
        cmd.args(["test", "--release", "--no-run", "--message-format=json"]);
        test_feature_args(&mut cmd, pkg, feature);
        for (name, exe) in built_executables(cmd, pkgs, true)? {
            copy_binary(&exe, &tests_dir.join(&name), opts.strip)?;
            n += 1;
        }
    }
    Ok(n)
}

/// An AMD GPU is visible: the ROCm kernel driver's node exists.
fn amd_gpu_present() -> bool {
    Path::new("/dev/kfd").exists()
}

/// An Intel GPU is visible: a DRM render node driven by i915 or xe.
fn intel_gpu_present() -> bool {
    let Ok(entries) = fs::read_dir("/sys/class/drm") else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("renderD")
            && fs::read_link(e.path().join("device/driver"))
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .is_some_and(|d| d == "i915" || d == "xe")
    })
}

/// `test-hip` / `test-level-zero`: with the hardware, run the vendor's test
/// packages here; without it, run them here anyway (they take the no-device
/// paths and skip with a reason) and pack release binaries into
/// `dist/<vendor>/` with `run.sh` for a machine that has the hardware.
fn test_vendor(
    opts: &Options,
    vendor: &str,
    packages: &[(&str, Option<&str>)],
    present: bool,
) -> Res<bool> {
    let pkgs = metadata()?;
    let selected = select(&pkgs, packages);
    let ok = run_tests_here(&selected, present)?;
    if present && !opts.pack {
        return Ok(ok);
    }
    println!("xtask: no {vendor} device here: packing test binaries for a machine with one");
    let dist = root().join("dist").join(vendor);
    let n = pack_tests(&pkgs, &selected, &dist, opts)?;
    let traces = pack_traces(&dist)?;
    let files = pack_repo_files(&dist)?;
    write_script(&dist.join("run.sh"), RUN_SH)?;
    println!(
        "xtask: packed {n} test binaries{}, the {files} files the tests read (repo/) into {}",
        if traces { ", traces/" } else { "" },
        dist.display()
    );
    println!("xtask: on the {vendor} machine run: dist/{vendor}/run.sh");
    Ok(ok)
}

#[derive(Default, Clone, Copy)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// Adds the numbers of a libtest `test result:` line to `c`.
fn parse_result_line(line: &str, c: &mut Counts) -> bool {
    let Some(rest) = line.trim().strip_prefix("test result:") else {
        return false;
    };
    for part in rest.split([';', '.']) {
        let mut words = part.split_whitespace();
        if let (Some(n), Some(what)) = (words.next(), words.next())
            && let Ok(n) = n.parse::<u64>()
        {
            match what {
                "passed" => c.passed += n,
                "failed" => c.failed += n,
                "ignored" => c.ignored += n,
                _ => {}
            }
        }
    }
    true
}

fn test_cuda(opts: &Options) -> Res<bool> {
    let pkgs = metadata()?;
    let selected = select(&pkgs, CUDA_TEST_PACKAGES);
    if !opts.pack && gpu_present() {
        return run_tests_here(&selected, true);
    }
    if !opts.pack {
        println!("xtask: no usable GPU here: packing test binaries for a GPU machine");
    }
    let dist = root().join("dist").join("cuda");
    let n = pack_tests(&pkgs, &selected, &dist, opts)?;
    let nb = pack_benches(&pkgs, &dist, opts)?;
    let capi = pack_capi(&pkgs, &dist, opts)?;
    let ne = pack_cudarc_example(&pkgs, &dist, opts)?;
    let traces = pack_traces(&dist)?;
    let files = pack_repo_files(&dist)?;
    write_script(&dist.join("run.sh"), RUN_SH)?;
    println!("xtask: packed {ne} cudarc example binaries into dist/cuda/cudarc");
    fs::write(dist.join("sanitizer-allow.txt"), SANITIZER_ALLOW)
        .map_err(|e| format!("writing sanitizer-allow.txt: {e}"))?;
    println!(
        "xtask: packed {n} test binaries, {nb} bench binaries{}{}, the {files} files the tests read (repo/) into {}",
        if capi {
            ", lib/libcachalot_capi.so"
        } else {
            ""
        },
        if traces { ", traces/" } else { "" },
        dist.display()
    );
    println!("xtask: on the GPU machine run: dist/cuda/run.sh (PyTorch: python/run_gpu_suite.sh)");
    Ok(true)
}

/// Builds the C ABI's cdylib (release; `cachalot-capi` always compiles the
/// CUDA backend in) and copies it to `dist/lib/libcachalot_capi.so` for the
/// PyTorch shim. False when the package is not in the workspace.
fn pack_capi(pkgs: &[Package], dist: &Path, opts: &Options) -> Res<bool> {
    if !pkgs.iter().any(|p| p.name == "cachalot-capi") {
        return Ok(false);
    }
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--message-format=json",
        "-p",
        "cachalot-capi",
        "--lib",
    ]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|e| format!("running cargo: {e}"))?;
    let mut so = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["reason"] != "compiler-artifact" || v["target"]["name"] != "cachalot_capi" {
                continue;
            }
            if let Some(files) = v["filenames"].as_array() {
                so = files
                    .iter()
                    .filter_map(Value::as_str)
                    .find(|f| f.ends_with(".so"))
                    .map(PathBuf::from)
                    .or(so);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building cachalot-capi failed: {status}"));
    }
    let so = so.ok_or("cargo reported no libcachalot_capi.so")?;
    let lib_dir = dist.join("lib");
    reset_dir(&lib_dir)?;
    copy_binary(&so, &lib_dir.join("libcachalot_capi.so"), opts.strip)?;
    Ok(true)
}

/// Runs the selected packages' tests here; `hardware`: the device they
/// test is present, so a test that skips fails (`CACHALOT_REQUIRE_GPU=1`).
fn run_tests_here(selected: &[(&Package, Option<String>)], hardware: bool) -> Res<bool> {
    let mut rows: Vec<(String, Counts, bool)> = Vec::new();
    for (pkg, feature) in selected {
        let mut cmd = cargo();
        cmd.args(["test", "--release"]);
        test_feature_args(&mut cmd, pkg, feature);
        if hardware {
            cmd.env("CACHALOT_REQUIRE_GPU", "1");
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("running cargo test: {e}"))?;
        let mut counts = Counts::default();
        if let Some(out) = child.stdout.take() {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("{line}");
                parse_result_line(&line, &mut counts);
            }
        }
        let ok = child.wait().map(|s| s.success()).unwrap_or(false);
        if !ok && counts.failed == 0 {
            counts.failed = 1; // build failure or crash
        }
        let label = match feature {
            Some(f) => format!("{} (+{f})", pkg.name),
            None => pkg.name.clone(),
        };
        rows.push((label, counts, ok));
    }
    println!();
    println!(
        "{:<40} {:>7} {:>7} {:>8}  status",
        "package", "passed", "failed", "ignored"
    );
    let mut total = Counts::default();
    for (label, c, ok) in &rows {
        println!(
            "{label:<40} {:>7} {:>7} {:>8}  {}",
            c.passed,
            c.failed,
            c.ignored,
            if *ok { "ok" } else { "FAILED" }
        );
        total.passed += c.passed;
        total.failed += c.failed;
        total.ignored += c.ignored;
    }
    println!("{} passed, {} failed", total.passed, total.failed);
    Ok(rows.iter().all(|(_, _, ok)| *ok))
}

/// Runs a cargo build command with `--message-format=json` and returns
/// (unique file name, executable) for each built executable (test-profile
/// ones only when `tests_only`).
fn built_executables(
    mut cmd: Command,
    pkgs: &[Package],
    tests_only: bool,
) -> Res<Vec<(String, PathBuf)>> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|e| format!("running cargo: {e}"))?;
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["reason"] != "compiler-artifact" {
                continue;
            }
            let Some(exe) = v["executable"].as_str() else {
                continue;
            };
            if tests_only && v["profile"]["test"] != true {
                continue;
            }
            let manifest = v["manifest_path"].as_str().unwrap_or_default();
            let pkg = pkgs
                .iter()
                .find(|p| p.manifest == manifest)
                .map(|p| p.name.as_str())
                .unwrap_or("unknown");
            let target = v["target"]["name"].as_str().unwrap_or("unknown");
            let kinds: Vec<&str> = v["target"]["kind"]
                .as_array()
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let name = if kinds.iter().any(|k| k.contains("lib")) {
                format!("{pkg}-lib")
            } else if kinds.contains(&"bin") {
                format!("{pkg}-bin-{target}")
            } else {
                format!("{pkg}-{target}")
            };
            if !out.iter().any(|(n, _): &(String, PathBuf)| *n == name) {
                out.push((name, PathBuf::from(exe)));
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed ({status})"));
    }
    Ok(out)
}

fn pack_benches(pkgs: &[Package], dist: &Path, opts: &Options) -> Res<usize> {
    let bench_dir = dist.join("bench");
    reset_dir(&bench_dir)?;
    let mut n = 0;
    for (pkg, feature) in select(pkgs, CUDA_BENCH_PACKAGES) {
        if !pkg.has_kind("bench") {
            continue;
        }
        let mut cmd = cargo();
        cmd.args(["bench", "--no-run", "--message-format=json"]);
        feature_args(&mut cmd, pkg, &feature);
        cmd.arg("--benches");
        for (name, exe) in built_executables(cmd, pkgs, false)? {
            if name.ends_with("-lib") {
                continue;
            }
            copy_binary(&exe, &bench_dir.join(&name), opts.strip)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Builds the cudarc example's release binary and test binaries into
/// `dist/cuda/cudarc/{bin,tests}` (emptied first); returns how many.
fn pack_cudarc_example(pkgs: &[Package], dist: &Path, opts: &Options) -> Res<usize> {
    let (name, bin) = CUDARC_EXAMPLE;
    let Some(pkg) = pkgs.iter().find(|p| p.name == name) else {
        println!("xtask: package {name} not in the workspace, skipped");
        return Ok(0);
    };
    let dir = dist.join("cudarc");
    reset_dir(&dir)?;
    let (bin_dir, tests_dir) = (dir.join("bin"), dir.join("tests"));
    reset_dir(&bin_dir)?;
    reset_dir(&tests_dir)?;
    let mut n = 0;
    let mut cmd = cargo();
    cmd.args(["test", "--release", "--no-run", "--message-format=json"]);
    feature_args(&mut cmd, pkg, &None);
    for (test, exe) in built_executables(cmd, pkgs, true)? {
        copy_binary(&exe, &tests_dir.join(&test), opts.strip)?;
        n += 1;
    }
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--message-format=json", "--bin", bin]);
    feature_args(&mut cmd, pkg, &None);
    for (_, exe) in built_executables(cmd, pkgs, false)? {
        if exe.file_stem().is_some_and(|s| s == bin) {
            copy_binary(&exe, &bin_dir.join(bin), opts.strip)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Copies `traces/` of the repository, or `../shared/traces` when the
/// repository's holds no trace (nor `synth_traces.py`), into `dist/cuda/traces`.
fn pack_traces(dist: &Path) -> Res<bool> {
    let dst = dist.join("traces");
    reset_dir(&dst)?;
    let candidates = [root().join("traces"), root().join("../shared/traces")];
    for src in candidates {
        let Ok(entries) = fs::read_dir(&src) else {
            continue;
        };
        let files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        let has_traces = files.iter().any(|f| {
            f.extension().is_some_and(|e| e == "trace")
                || f.file_name().is_some_and(|n| n == "synth_traces.py")
        });
        if !has_traces {
            continue;
        }
        for f in files {
            if let Some(name) = f.file_name() {
                copy_file(&f, &dst.join(name))?;
            }
        }
        return Ok(true);
    }
    Ok(false)
}

/// Copies [`PACKED_REPO_PATHS`] into `dist/repo/` (emptied first), under
/// the same relative paths; returns how many files. A path that matches
/// nothing is an error: the tests would fail on the other machine.
fn pack_repo_files(dist: &Path) -> Res<usize> {
    let dst = dist.join("repo");
    reset_dir(&dst)?;
    let mut n = 0;
    for rel in PACKED_REPO_PATHS {
        let files = repo_files(&root(), rel)?;
        if files.is_empty() {
            return Err(format!("{rel}: no file to pack"));
        }
        for f in files {
            let to = dst.join(&f);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)
                    .map_err(|e| format!("creating {}: {e}", parent.display()))?;
            }
            copy_file(&root().join(&f), &to)?;
            n += 1;
        }
    }
    Ok(n)
}

/// The files (paths relative to `repo`) that `pattern` of
/// [`PACKED_REPO_PATHS`] names: every file under a folder, or the files of
/// `dir` ending in `ext` for `dir/*ext`.
fn repo_files(repo: &Path, pattern: &str) -> Res<Vec<PathBuf>> {
    let mut out = Vec::new();
    if let Some((dir, suffix)) = pattern.split_once("/*") {
        let entries = fs::read_dir(repo.join(dir)).map_err(|e| format!("reading {dir}: {e}"))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_file() && name.ends_with(suffix) {
                out.push(Path::new(dir).join(name));
            }
        }
    } else {
        let mut stack = vec![PathBuf::from(pattern)];
        while let Some(rel) = stack.pop() {
            let entries = fs::read_dir(repo.join(&rel))
                .map_err(|e| format!("reading {}: {e}", rel.display()))?;
            for e in entries.flatten() {
                let child = rel.join(e.file_name());
                if e.path().is_dir() {
                    stack.push(child);
                } else {
                    out.push(child);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

fn bench_cuda(opts: &Options) -> Res<bool> {
    let pkgs = metadata()?;
    let dist = root().join("dist").join("cuda");
    fs::create_dir_all(&dist).map_err(|e| format!("creating {}: {e}", dist.display()))?;
    let nb = pack_benches(&pkgs, &dist, opts)?;

    let bin_dir = dist.join("bin");
    reset_dir(&bin_dir)?;
    let mut clis = 0;
    for (pkg_name, bin, feature) in CLI_BINARIES {
        let Some(pkg) = pkgs.iter().find(|p| p.name == *pkg_name) else {
            println!("xtask: package {pkg_name} not in the workspace, CLI skipped");
            continue;
        };
        if !pkg.targets.iter().any(|(k, n)| k == "bin" && n == bin) {
            println!("xtask: package {pkg_name} has no binary `{bin}`, skipped");
            continue;
        }
        let feature = feature
            .filter(|f| pkg.features.iter().any(|x| x == f))
            .map(str::to_string);
        let mut cmd = cargo();
        cmd.args(["build", "--release", "--message-format=json", "--bin", bin]);
        feature_args(&mut cmd, pkg, &feature);
        for (_, exe) in built_executables(cmd, &pkgs, false)? {
            if exe.file_stem().is_some_and(|s| s == *bin) {
                copy_binary(&exe, &bin_dir.join(bin), opts.strip)?;
                clis += 1;
            }
        }
    }

    let harness_dir = dist.join("pytorch");
    reset_dir(&harness_dir)?;
    // the folder of an older pack, whose sources came from outside the repository
    let old_anchor = dist.join("anchor");
    if old_anchor.exists() {
        fs::remove_dir_all(&old_anchor)
            .map_err(|e| format!("removing {}: {e}", old_anchor.display()))?;
    }
    for (name, text, exec) in PYTORCH_HARNESS {
        let path = harness_dir.join(name);
        if *exec {
            write_script(&path, text)?;
        } else {
            fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    let traces = pack_traces(&dist)?;
    write_script(&dist.join("bench.sh"), BENCH_SH)?;
    println!(
        "xtask: packed {nb} bench binaries, {clis} CLI binaries, the PyTorch harnesses (pytorch/){} into {}",
        if traces { " and traces/" } else { "" },
        dist.display()
    );
    println!("xtask: on the GPU machine run: dist/cuda/bench.sh");
    Ok(true)
}

fn reset_dir(dir: &Path) -> Res<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))
}

fn copy_file(src: &Path, dst: &Path) -> Res<()> {
    fs::copy(src, dst)
        .map(|_| ())
        .map_err(|e| format!("copying {} to {}: {e}", src.display(), dst.display()))
}

/// Copies an executable, dropping its debug info with `strip` when asked and
/// available (the packed folder must stay small enough to ship).
fn copy_binary(src: &Path, dst: &Path, strip: bool) -> Res<()> {
    copy_file(src, dst)?;
    if strip {
        // Best effort: without `strip` the binary keeps its debug info.
        let _ = Command::new("strip")
            .arg("--strip-debug")
            .arg(dst)
            .stderr(Stdio::null())
            .status();
    }
    Ok(())
}

fn write_script(path: &Path, text: &str) -> Res<()> {
    fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    set_executable(path)
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Res<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Res<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libtest_summary() {
        let mut c = Counts::default();
        assert!(parse_result_line(
            "test result: ok. 8 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s",
            &mut c
        ));
        assert!(!parse_result_line("running 8 tests", &mut c));
        assert_eq!((c.passed, c.failed, c.ignored), (8, 2, 1));
    }

    #[test]
    fn scripts_are_bash() {
        assert!(RUN_SH.starts_with("#!/usr/bin/env bash"));
        assert!(BENCH_SH.starts_with("#!/usr/bin/env bash"));
    }

    /// The JSON keys written by a format string: every `\"key\":` of `text`
    /// (escaped quotes, as in Rust and C format strings), in order.
    fn json_keys(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("\\\"") {
            rest = &rest[i + 2..];
            let key: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !key.is_empty() && rest[key.len()..].starts_with("\\\":") {
                rest = &rest[key.len() + 3..];
                out.push(key);
            }
        }
        out
    }

    /// The body of `fn name` in `src` (from its line to the next line that
    /// closes a top-level item).
    fn fn_body<'a>(src: &'a str, name: &str) -> &'a str {
        let start = src.find(&format!("fn {name}")).expect(name);
        let end = src[start..].find("\n}\n").map_or(src.len(), |e| start + e);
        &src[start..end]
    }

    const CORE_REPLAY_RUN: &str = include_str!("../../crates/cachalot-core/src/replay/run.rs");
    const CORE_THREADS: &str = include_str!("../../crates/cachalot-core/src/replay/threads.rs");
    const CORE_RNG: &str = include_str!("../../crates/cachalot-core/src/rng.rs");

    /// The PyTorch replay prints every field of `cachalot replay --json`,
    /// first and in the same order, so that bench.sh reads both alike.
    #[test]
    fn torch_replay_prints_cachalots_replay_fields() {
        let report = &CORE_REPLAY_RUN[CORE_REPLAY_RUN.find("impl ReplayReport").unwrap()..];
        let ours = json_keys(fn_body(report, "to_json"));
        assert_eq!(ours.first().map(String::as_str), Some("trace"));
        assert!(ours.len() >= 9, "{ours:?}");
        let (_, cpp, _) = PYTORCH_HARNESS
            .iter()
            .find(|h| h.0 == "torch_replay.cpp")
            .unwrap();
        // the printf of the report (not the one of --parse-only)
        let at = cpp.find("cold_ns_per_op\\\"").unwrap();
        let start = cpp[..at].rfind("printf(").unwrap();
        let end = at + cpp[at..].find(");").unwrap();
        let torch = json_keys(&cpp[start..end]);
        assert_eq!(&torch[..ours.len()], &ours[..], "{torch:?}");
        for k in ["mode", "live_peak", "passes"] {
            assert!(torch.iter().any(|t| t == k), "{k}: {torch:?}");
        }
        // bench.sh reads the fields it tabulates
        for k in [
            "warm_ns_per_op",
            "peak_reserved",
            "device_allocs_all",
            "live_peak",
            "mode",
        ] {
            assert!(BENCH_SH.contains(&format!("\"{k}\"")), "{k}");
        }
    }

    /// The PyTorch threads benchmark prints `cachalot threads`' fields and
    /// runs its workload: the same random-number constants and shifts, the
    /// same warm-up, slots and sizes.
    #[test]
    fn torch_threads_mirrors_cachalots_threads_bench() {
        let (_, cpp, _) = PYTORCH_HARNESS
            .iter()
            .find(|h| h.0 == "torch_threads.cpp")
            .unwrap();
        let report = &CORE_THREADS[CORE_THREADS.find("impl ThreadsReport").unwrap()..];
        let ours = json_keys(fn_body(report, "to_json"));
        // (then cachalot's own: how the operations were served)
        assert_eq!(ours[..3], ["threads", "ops", "mops_per_s"]);
        assert_eq!(&json_keys(cpp)[..3], &ours[..3]);
        let bench = fn_body(CORE_THREADS, "threads_bench");
        // (the seed is the bench's; the generator is `rng.rs`'s)
        assert!(bench.contains("SplitMix64::new"));
        let generator = fn_body(CORE_RNG, "next_u64");
        let mut constants = 0;
        for word in [bench, generator]
            .iter()
            .flat_map(|b| b.split(|c: char| !c.is_ascii_alphanumeric() && c != '_'))
        {
            if let Some(hex) = word.strip_prefix("0x") {
                let hex = hex
                    .replace('_', "")
                    .trim_end_matches("u64")
                    .to_ascii_uppercase();
                assert!(cpp.contains(&format!("0x{hex}ull")), "constant 0x{hex}");
                constants += 1;
            }
        }
        assert!(constants >= 4, "{constants}");
        for shift in [">> 30", ">> 27", ">> 31"] {
            assert!(generator.contains(shift) && cpp.contains(shift), "{shift}");
        }
        assert!(bench.contains("run(20_000)") && cpp.contains("kWarmupOps = 20000"));
        assert!(bench.contains("% 64") && cpp.contains("% 64"));
        assert!(
            bench.contains("512 << (next() % 12)") && cpp.contains("512} << (rng.next() % 12)")
        );
        // and the thread counts and operations of `cachalot threads`' defaults
        let cli = include_str!("../../crates/cachalot-cli/src/main.rs");
        assert!(cli.contains("default_value = \"1,2,4,8,16\""));
        assert!(cli.contains("default_value_t = 200_000"));
        assert!(cpp.contains("counts = {1, 2, 4, 8, 16}") && cpp.contains("ops = 200000"));
    }

    /// bench.sh builds the packed harnesses with the packed build.sh, which
    /// builds both sources, and runs the binaries it builds.
    #[test]
    fn bench_sh_builds_and_runs_the_packed_harness() {
        let build = PYTORCH_HARNESS.iter().find(|h| h.0 == "build.sh").unwrap();
        assert!(build.2 && build.1.starts_with("#!/usr/bin/env bash"));
        assert!(build.1.contains("for n in torch_replay torch_threads"));
        assert!(BENCH_SH.contains("pytorch/build.sh build"));
        for b in ["build/torch_replay", "build/torch_threads"] {
            assert!(BENCH_SH.contains(b), "{b}");
        }
        for (name, text, _) in PYTORCH_HARNESS {
            if name.ends_with(".cpp") {
                assert!(text.contains("#include \"bench_common.h\""), "{name}");
                assert!(text.contains("CUDACachingAllocator"), "{name}");
            }
        }
    }

    /// The `.rs` files under `dir` (recursively).
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The packed test binaries find every file they read through
    /// `repo_root()` / `traces_dir()` of the conformance crate, and what
    /// they read is packed: no other use of `CARGO_MANIFEST_DIR` (a path
    /// of the build machine), every `repo_root().join("X")` under a path
    /// of [`PACKED_REPO_PATHS`], every proptest block reading its saved
    /// cases through `proptest_regressions` (proptest's default looks next
    /// to the source file), and every packed path matching files.
    #[test]
    fn packed_tests_read_only_what_is_packed() {
        let repo = root();
        let mut dirs: Vec<PathBuf> = Vec::new();
        let pkgs = metadata().expect("cargo metadata");
        for list in [
            CUDA_TEST_PACKAGES,
            HIP_TEST_PACKAGES,
            LEVEL_ZERO_TEST_PACKAGES,
        ] {
            for (name, _) in list {
                let p = pkgs.iter().find(|p| p.name == *name).expect(name);
                dirs.push(Path::new(&p.manifest).parent().unwrap().to_path_buf());
            }
        }
        dirs.sort();
        dirs.dedup();
        let mut files = Vec::new();
        for d in &dirs {
            rust_files(&d.join("src"), &mut files);
            rust_files(&d.join("tests"), &mut files);
        }
        assert!(files.len() > 20, "{files:?}");
        let lib = repo.join("tests").join("src").join("lib.rs");
        let mut joins = 0;
        for f in &files {
            let text = fs::read_to_string(f).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            if *f != lib {
                assert!(
                    !code.contains("CARGO_MANIFEST_DIR"),
                    "{}: reads a path of the build machine; use cachalot_conformance::repo_root()",
                    f.display()
                );
            }
            let mut rest = code.as_str();
            while let Some(i) = rest.find("repo_root().join(\"") {
                rest = &rest[i + 18..];
                let arg = &rest[..rest.find('"').unwrap()];
                joins += 1;
                assert!(
                    arg == "traces"
                        || PACKED_REPO_PATHS.iter().any(|p| {
                            *p == arg
                                || p.starts_with(&format!("{arg}/"))
                                || arg.starts_with(&format!("{p}/"))
                        }),
                    "{}: reads {arg}/, which `cargo xtask test-cuda` does not pack (PACKED_REPO_PATHS)",
                    f.display()
                );
            }
            if code.contains("proptest! {") {
                let stem = f.file_stem().unwrap().to_string_lossy();
                assert!(
                    code.contains(&format!("proptest_regressions(\"{stem}\")")),
                    "{}: the proptest block must read its saved cases through \
                     cachalot_conformance::proptest_regressions(\"{stem}\")",
                    f.display()
                );
            }
        }
        assert!(
            joins >= 1,
            "no repo_root().join(..) found: the scan is broken"
        );
        for rel in PACKED_REPO_PATHS {
            let found = repo_files(&repo, rel).unwrap();
            assert!(!found.is_empty(), "{rel}");
        }
        // every saved proptest file of the conformance tests is packed
        let saved = repo_files(&repo, "tests/tests/*.proptest-regressions").unwrap();
        assert!(saved.len() >= 2, "{saved:?}");
    }

    /// The pack's `repo/` holds the listed files under their repository
    /// paths, byte for byte: the engine seeds fuzz_regressions replays and
    /// proptest's saved cases among them.
    #[test]
    fn pack_repo_files_copies_the_listed_files() {
        let dist = std::env::temp_dir().join(format!("cachalot-xtask-pack-{}", std::process::id()));
        let n = pack_repo_files(&dist).unwrap();
        let mut want = Vec::new();
        for rel in PACKED_REPO_PATHS {
            want.extend(repo_files(&root(), rel).unwrap());
        }
        assert_eq!(n, want.len());
        for rel in &want {
            let packed = fs::read(dist.join("repo").join(rel)).unwrap();
            assert_eq!(
                packed,
                fs::read(root().join(rel)).unwrap(),
                "{}",
                rel.display()
            );
        }
        for must in [
            "fuzz/seeds/engine",
            "fuzz/regressions/engine",
            "fuzz/seeds/pools",
            "tests/tests/capture.proptest-regressions",
        ] {
            assert!(dist.join("repo").join(must).exists(), "{must}");
        }
        fs::remove_dir_all(&dist).unwrap();
    }

    /// Every rule of the allow-list has run.sh's three fields, and names
    /// a CUDA error.
    #[test]
    fn sanitizer_allow_list_parses() {
        let mut rules = 0;
        for line in SANITIZER_ALLOW.lines() {
            let rule = line.split('#').next().unwrap_or_default();
            let w: Vec<&str> = rule.split_whitespace().collect();
            if w.is_empty() {
                continue;
            }
            assert_eq!(w.len(), 3, "want `binary error call`: {line}");
            assert!(w[1].starts_with("CUDA_ERROR_"), "{line}");
            rules += 1;
        }
        assert!(rules > 0);
    }
}
