//! Compiles and links the PyTorch C++ shim (`python/cachalot_torch/shim.cpp`)
//! with g++ against a torch installation's headers and libraries and the
//! built cdylib, with `-Wall -Wextra -Werror -Woverloaded-virtual
//! -Wl,--no-undefined`: every pure virtual of PyTorch's `CUDAAllocator` is
//! overridden (the shim instantiates its subclass), every override matches
//! a virtual of that torch version, and every symbol resolves in `libc10`,
//! `libc10_cuda`, `libcudart` and this crate's C ABI.
//!
//! Needs a torch tree, which `cargo test` does not have by itself: set
//! `CACHALOT_TORCH_DIR` (the `torch/` package folder, with `include/` and
//! `lib/`, e.g. unpacked from the wheel), `CACHALOT_CUDA_INCLUDE` (a folder
//! with `cuda_runtime_api.h` and `crt/host_config.h`, e.g. from the
//! `nvidia-cuda-runtime` and `nvidia-cuda-crt` wheels) and
//! `CACHALOT_CUDART_DIR` (a folder with `libcudart.so.13`). Without them it
//! prints `skipped: <reason>`.
//!
//! Then it runs the shim: each `tests/shim_driver*.cpp` (their shared setup
//! in `tests/shim_driver_common.h`), linked with the shim and the real
//! `libc10` / `libc10_cuda`, installs cachalot on the mock device
//! (`CACHALOT_TORCH_BACKEND=mock`) and drives every method through torch's
//! own entry points (`c10::cuda::CUDACachingAllocator::*`,
//! `c10::GetAllocator`), printing `shim driver: ok`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).map(PathBuf::from)
}

fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test binary's folder");
    let name = "libcachalot_capi.so";
    [deps.join(name), deps.parent().unwrap_or(deps).join(name)]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("libcachalot_capi.so next to the test binary")
}

#[test]
#[cfg_attr(miri, ignore = "runs g++")]
fn shim_builds_against_torch_and_runs_inside_it() {
    let (Some(torch), Some(cuda_inc), Some(cudart)) = (
        var("CACHALOT_TORCH_DIR"),
        var("CACHALOT_CUDA_INCLUDE"),
        var("CACHALOT_CUDART_DIR"),
    ) else {
        // a direct write: libtest captures println! of a passing test
        use std::io::Write;
        let _ = std::io::stderr().write_all(
            b"skipped: set CACHALOT_TORCH_DIR, CACHALOT_CUDA_INCLUDE and CACHALOT_CUDART_DIR \
              to build the PyTorch shim against a torch tree\n",
        );
        return;
    };
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shim = manifest.join("../../python/cachalot_torch/shim.cpp");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("libcachalot_torch_shim.so");
    let output = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-fPIC", "-shared"])
        .args(["-Wall", "-Wextra", "-Werror", "-Woverloaded-virtual"])
        .arg("-isystem")
        .arg(torch.join("include"))
        .arg("-isystem")
        .arg(&cuda_inc)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(&shim)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(torch.join("lib"))
        .arg("-L")
        .arg(&cudart)
        .args(["-lc10", "-lc10_cuda", "-l:libcudart.so.13"])
        .arg(cdylib())
        .arg("-Wl,--no-undefined")
        .output()
        .unwrap_or_else(|e| panic!("running {cxx}: {e}"));
    assert!(
        output.status.success(),
        "building the shim failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // the drivers (tests/shim_driver*.cpp, one process each; each includes
    // tests/shim_driver_common.h): the shim inside torch's libraries, on the
    // mock device
    let mut drivers: Vec<PathBuf> = std::fs::read_dir(manifest.join("tests"))
        .expect("the tests folder")
        .map(|e| e.expect("a tests entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("shim_driver") && name.ends_with(".cpp")
        })
        .collect();
    drivers.sort();
    assert!(!drivers.is_empty(), "no tests/shim_driver*.cpp");
    for source in drivers {
        run_driver(&cxx, &torch, &cuda_inc, &cudart, &out, &source);
    }
}

/// Builds driver `source` against torch, the shim `shim` and this crate's
/// library, runs it on the mock, and checks it prints "shim driver: ok".
fn run_driver(cxx: &str, torch: &Path, cuda_inc: &Path, cudart: &Path, shim: &Path, source: &Path) {
    let out = shim;
    let lib = cdylib();
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("driver");
    let driver = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cachalot_{stem}"));
    let output = Command::new(cxx)
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg("-isystem")
        .arg(torch.join("include"))
        .arg("-isystem")
        .arg(cuda_inc)
        .arg(source)
        .arg("-o")
        .arg(&driver)
        .arg(out)
        .arg(&lib)
        .arg("-L")
        .arg(torch.join("lib"))
        .arg("-L")
        .arg(cudart)
        .args([
            "-lc10",
            "-lc10_cuda",
            "-l:libcudart.so.13",
            "-Wl,--export-dynamic",
        ])
        .output()
        .unwrap_or_else(|e| panic!("running {cxx}: {e}"));
    assert!(
        output.status.success(),
        "building {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let paths =
        std::env::join_paths([torch.join("lib"), cudart.to_path_buf()]).expect("library path");
    let run = Command::new(&driver)
        .env("CACHALOT_TORCH_BACKEND", "mock")
        .env("LD_LIBRARY_PATH", paths)
        .env_remove("CACHALOT_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .expect("running the driver");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("shim driver: ok"),
        "{} failed ({}):\n{stdout}{}",
        source.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}
