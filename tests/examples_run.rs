//! Examples a user runs first, run as they would (their binaries, which `cargo test` builds
//! beside the tests), so that one that fails now and then is caught: the `gang` example once
//! failed 5 runs in 9 ("left behind: [], cpu busy: true": it counted free cpus before a
//! cancelled task's worker had confirmed its end).

use std::path::PathBuf;
use std::process::Command;

/// The binary of example `name`, built by `cargo test` in `target/<profile>/examples`.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .expect("the test's path")
        .parent()
        .expect("target/<profile>/deps")
        .to_path_buf();
    let path = deps
        .parent()
        .expect("target/<profile>")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples; run it with --examples or the \
         whole suite",
        path.display()
    );
    path
}

#[test]
fn the_gang_example_leaves_nothing_behind_every_time() {
    let gang = example("gang");
    for run in 1..=3 {
        let out = Command::new(&gang).output().expect("the gang example");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "run {run} failed ({}):\n{said}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            said.matches("nothing left behind").count(),
            4,
            "run {run}:\n{said}"
        );
    }
}
