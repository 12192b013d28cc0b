//! A test that cannot run here says so in `cargo test`'s own output: the
//! note of [`cachalot_conformance::skip`] shows although libtest captures
//! what passing tests print, and under `CACHALOT_REQUIRE_GPU=1` the skip is
//! a failure. Each case runs this test binary again, on one test, as
//! `cargo test` would (output captured, no `--nocapture`).

use std::process::{Command, Output};

const CHILD: &str = "CACHALOT_SKIP_NOTES_CHILD";

/// Skips, when this binary was started by the tests below.
#[test]
fn child_that_skips() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    cachalot_conformance::skip("the note of a skipped test");
}

fn run_child(require_gpu: &str) -> Output {
    let exe = std::env::current_exe().expect("current_exe");
    Command::new(exe)
        .args(["child_that_skips", "--exact", "--test-threads=1"])
        .env(CHILD, "1")
        .env("CACHALOT_REQUIRE_GPU", require_gpu)
        .output()
        .expect("run this test binary")
}

#[test]
fn a_skip_shows_one_line_in_captured_output() {
    let out = run_child("0");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("test child_that_skips ... ok"), "{stdout}");
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("skipped:"))
        .collect();
    assert_eq!(
        notes,
        ["skipped: the note of a skipped test"],
        "stdout: {stdout}\nstderr: {stderr}"
    );
}

#[test]
fn under_require_gpu_a_skip_fails() {
    let out = run_child("1");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("CACHALOT_REQUIRE_GPU is set, and this test would skip"),
        "{stdout}"
    );
}
