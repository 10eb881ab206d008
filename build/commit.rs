// Shared by the build scripts of the three binaries' crates (`include!`d): the commit the
// binary is built from, for `--version`. It is read when the crate's build script runs (a
// fresh build, or a change in the crate), so an incremental build after a commit that did not
// touch the crate keeps the previous one; a build outside a git checkout says `unknown`.

/// Sets `ESCHER_COMMIT` for the crate: the short commit hash, `+changes` when the tree had
/// uncommitted changes, or `unknown`.
fn emit_commit() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(hash) if !hash.is_empty() => {
            let changed = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if changed {
                format!("{hash}+changes")
            } else {
                hash
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=ESCHER_COMMIT={commit}");
}
