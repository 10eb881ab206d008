//! The `escher-head` binary as an operator meets it first: its version, its help, and a clear
//! refusal of a bad flag. (The end-to-end tests in the workspace's `tests/` run it for real;
//! this test is also what makes `cargo test --workspace` build it for them.)

use std::process::Command;

fn head() -> Command {
    Command::new(env!("CARGO_BIN_EXE_escher-head"))
}

#[test]
fn version_names_the_binary_and_the_crate_version() {
    let out = head().arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!(
            "escher-head {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            env!("ESCHER_COMMIT")
        )
    );
}

#[test]
fn help_names_the_flags_of_the_operator_conventions() {
    let out = head().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--listen",
        "--data-dir",
        "--peers",
        "--metrics",
        "--dashboard",
    ] {
        assert!(text.contains(flag), "--help does not name {flag}:\n{text}");
    }
}

#[test]
fn a_bad_listen_address_is_refused_with_the_flag_named() {
    let out = head().args(["--listen", "nonsense"]).output().unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8(out.stderr).unwrap();
    assert!(text.contains("--listen"), "{text}");
    assert!(text.contains("nonsense"), "{text}");
}
