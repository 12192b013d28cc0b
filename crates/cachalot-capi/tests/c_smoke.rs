//! Compiles `tests/smoke.c` with `cc` against `include/cachalot.h` and the
//! built `libcachalot_capi.so`, then runs it on the mock backend. Skipped,
//! with the reason printed, when there is no C compiler (a failure under
//! `CACHALOT_REQUIRE_GPU=1`); the cdylib is always there under `cargo test`
//! (built with the library for this test), so not finding it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Reports a test that cannot run here: writes `skipped: <reason>` to
/// stderr and returns, or panics when `CACHALOT_REQUIRE_GPU` is set (to
/// anything but `0`): the packed `run.sh` sets it on the machine with the
/// hardware, where a skip would hide a test that never ran. The note is a
/// direct write to stderr, which libtest does not capture (it captures
/// `println!`), so `cargo test` shows it.
fn skip(reason: impl std::fmt::Display) {
    if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {reason}");
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("skipped: {reason}\n").as_bytes());
}

/// The directory holding the cdylib. `cargo test` builds it next to this
/// test binary, in `target/<profile>/deps/`; `cargo build` puts a copy in
/// `target/<profile>/`, which may be older. The newest of the two wins.
fn cdylib_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let name = format!(
        "{}cachalot_capi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let deps = exe.parent().ok_or("the test binary has no folder")?;
    let candidates: Vec<&Path> = [Some(deps), deps.parent()].into_iter().flatten().collect();
    candidates
        .iter()
        .filter_map(|d| {
            let m = std::fs::metadata(d.join(&name)).ok()?.modified().ok()?;
            Some((m, d.to_path_buf()))
        })
        .max()
        .map(|(_, d)| d)
        .ok_or_else(|| format!("{name} not found in {candidates:?}"))
}

#[test]
#[cfg_attr(
    miri,
    ignore = "runs a C compiler and the built program: process spawning Miri cannot run"
)]
fn c_smoke_test() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        skip(format_args!("no C compiler ('{cc}') on PATH"));
        return;
    }
    let lib_dir = cdylib_dir().unwrap_or_else(|e| panic!("the cdylib: {e}"));
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cachalot_smoke");
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(manifest.join("tests/smoke.c"))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lcachalot_capi")
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed: {status}");
    let run = Command::new(&out)
        .env("CACHALOT_BACKEND", "mock")
        .env_remove("CACHALOT_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .expect("running the smoke binary");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && stdout.contains("smoke: ok"),
        "smoke failed ({}):\n{stdout}\n{stderr}",
        run.status
    );
}
