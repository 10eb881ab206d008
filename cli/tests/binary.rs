//! The `escher` binary from the outside: version, help, and what it says when no head answers.
//! (The fake-head tests in `client/tests/` drive the CLI's library in process, and the
//! end-to-end tests in the workspace's `tests/` run this binary against real heads; this test is
//! also what makes `cargo test --workspace` build it for them.)

use std::process::Command;

fn escher(home: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_escher"));
    // A home of its own: no access or defaults file of the machine's is read.
    cmd.env("ESCHER_HOME", home).env_remove("ESCHER_HEAD");
    cmd.env_remove("ESCHER_ACCESS_FILE")
        .env_remove("ESCHER_TOKEN");
    cmd
}

fn home() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("escher-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn version_and_help() {
    let home = home();
    let out = escher(&home).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        text.trim(),
        format!(
            "escher {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            env!("ESCHER_COMMIT")
        )
    );

    let out = escher(&home).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for command in [
        "status", "submit", "get", "resource", "tasks", "logs", "token",
    ] {
        assert!(
            text.contains(command),
            "--help does not name {command}:\n{text}"
        );
    }

    // The flags a command's help names exist (`tasks --help` once named an `--output`).
    let out = escher(&home).args(["tasks", "--help"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("--json"), "{text}");
    assert!(!text.contains("--output"), "{text}");
}

#[test]
fn no_head_listening_is_a_failure_that_says_where_it_looked_and_what_to_do() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = escher(&home())
        .args(["--head", &url, "status"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8(out.stderr).unwrap();
    assert!(text.starts_with("error: "), "{text}");
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("ESCHER_HEAD"), "{text}");
}

#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    // `escher completion bash | head -c 16`: the reader takes 16 bytes and closes the pipe.
    let mut child = escher(&home())
        .args(["completion", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's read end is dropped here, before the script (tens of KB) is written whole.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(String::from_utf8_lossy(&first).starts_with("_escher()"));
}

#[test]
fn a_head_url_of_another_scheme_is_refused_before_any_connection() {
    for url in ["htp://127.0.0.1:7600", "ftp://127.0.0.1:7600"] {
        let out = escher(&home())
            .args(["--head", url, "status"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let text = String::from_utf8(out.stderr).unwrap();
        assert!(text.contains("http:// or https://"), "{text}");
        assert!(!text.contains("connect"), "it tried to connect: {text}");
    }
}
