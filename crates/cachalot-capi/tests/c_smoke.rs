//! Compiles `tests/smoke.c` with `cc` against `include/cachalot.h` and the
//! built `libcachalot_capi.so`, then runs it on the mock backend. Skipped,
//! with the reason printed, when `cc` or the cdylib is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding the cdylib: the profile directory above `deps/`.
fn cdylib_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    let name = format!(
        "{}cachalot_capi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    profile.join(&name).exists().then(|| profile.to_path_buf())
}

#[test]
#[cfg_attr(
    miri,
    ignore = "runs a C compiler and the built program: process spawning Miri cannot run"
)]
fn c_smoke_test() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if Command::new(&cc).arg("--version").output().is_err() {
        println!("skipped: no C compiler ('{cc}') on PATH");
        return;
    }
    let Some(lib_dir) = cdylib_dir() else {
        println!("skipped: the cdylib libcachalot_capi was not found next to the test binary");
        return;
    };
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
