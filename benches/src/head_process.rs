//! `escher-head` as a separate process (W8): found or built, started on a free loopback port
//! (`--listen 127.0.0.1:0 --address-file`), and read from `/proc/PID/status` (resident memory)
//! and `/proc/PID/stat` (CPU time). Killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// How long the head may take to write its address file.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `escher-head` process.
#[derive(Debug)]
pub struct HeadProcess {
    child: Child,
    pid: u32,
    url: String,
    admin_token: String,
    access_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl HeadProcess {
    /// Starts `bin` on a free loopback port with these extra flags, and waits until it listens.
    pub async fn start(bin: &Path, extra: &[&str]) -> anyhow::Result<HeadProcess> {
        HeadProcess::start_at(bin, "127.0.0.1:0", extra).await
    }

    /// Starts `bin` listening on `listen` with these extra flags, and waits until it listens.
    pub async fn start_at(bin: &Path, listen: &str, extra: &[&str]) -> anyhow::Result<HeadProcess> {
        let dir = tempfile::tempdir()?;
        let address_file = dir.path().join("head.url");
        let log = std::fs::File::create(dir.path().join("head.log"))?;
        // Its own access file unless the caller shares one between replicas (`--access-file`).
        let shared = extra.iter().position(|a| *a == "--access-file");
        let access_file = match shared {
            Some(i) => PathBuf::from(extra.get(i + 1).context("--access-file without a path")?),
            None => dir.path().join(escher_proto::access::FILE_NAME),
        };
        let mut command = Command::new(bin);
        command
            .args(["--listen", listen, "--address-file"])
            .arg(&address_file);
        if shared.is_none() {
            command.arg("--access-file").arg(&access_file);
        }
        let mut child = command
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let pid = child.id().context("the head exited at once")?;
        let start = Instant::now();
        let url = loop {
            if let Ok(url) = std::fs::read_to_string(&address_file) {
                break url.trim().to_string();
            }
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(dir.path().join("head.log")).unwrap_or_default();
                bail!("escher-head exited with {status} before listening: {log}");
            }
            if start.elapsed() > START_TIMEOUT {
                bail!("escher-head did not listen within {START_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Clients and simulated workers of this process find its tokens by its URL.
        let access = escher_proto::access::AccessFile::read(&access_file)?;
        escher_proto::access::register(&url, &access);
        Ok(HeadProcess {
            child,
            pid,
            url,
            admin_token: access.admin_token.clone(),
            access_file,
            _dir: dir,
        })
    }

    /// The head's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin token of its access file.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Its access file (the admin credential, which workers may join with).
    pub fn access_file(&self) -> &Path {
        &self.access_file
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Resident memory now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        status_field(self.pid, "VmRSS")
    }

    /// The peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> anyhow::Result<u64> {
        status_field(self.pid, "VmHWM")
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        cpu_seconds(self.pid)
    }

    /// Stops the head (SIGKILL) and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// CPU time process `pid` used so far (user + system, all threads), in seconds, at the
/// kernel's 10 ms resolution.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .context("malformed /proc/PID/stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
        let ticks: u64 = fields
            .get(11..13)
            .context("short /proc/PID/stat")?
            .iter()
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .sum();
        Ok(ticks as f64 / clock_ticks_per_second())
    }
}

/// `_SC_CLK_TCK`: 100 on every Linux this runs on (the kernel's USER_HZ).
fn clock_ticks_per_second() -> f64 {
    100.0
}

/// A `kB` field of `/proc/PID/status`.
fn status_field(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    parse_status_kib(&status, field).with_context(|| format!("no {field} in /proc/{pid}/status"))
}

fn parse_status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Finds the `escher-head` binary: `explicit` (`--head-bin` or `ESCHER_HEAD_BIN`) as given;
/// otherwise as [`find_bin`] finds it, so that W8 never measures a stale head.
pub fn find_head_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        bail!("no escher-head binary at {}", path.display());
    }
    find_bin("escher-head", "escher-head")
}

/// Finds binary `bin` of `package`: the one next to this executable (or one folder up, for
/// test executables in `deps/`), first (re)built with cargo in this executable's profile when
/// cargo started this process (`cargo run`, `cargo test`), so that a workload never measures
/// a stale binary.
pub fn find_bin(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let candidates = |exe: &Path| -> Vec<PathBuf> {
        exe.ancestors()
            .skip(1)
            .take(2)
            .map(|dir| dir.join(bin))
            .collect()
    };
    let found = candidates(&exe).into_iter().find(|p| p.is_file());
    let under_cargo = std::env::var_os("CARGO").is_some();
    if let Some(found) = &found
        && !under_cargo
    {
        return Ok(found.clone());
    }
    build_bin(&exe, package, bin)?;
    candidates(&exe)
        .into_iter()
        .find(|p| p.is_file())
        .with_context(|| format!("{bin} was built but not found next to escher-bench"))
}

/// `cargo build -p PACKAGE --bin BIN` in the profile and target folder of `exe` (a no-op when
/// it is up to date).
fn build_bin(exe: &Path, package: &str, bin: &str) -> anyhow::Result<()> {
    // target/<profile>/escher-bench or target/<profile>/deps/smoke-HASH
    let profile_dir = exe
        .ancestors()
        .skip(1)
        .find(|d| d.file_name().is_some_and(|n| n != "deps"))
        .context("cannot tell the build profile of this executable")?;
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", package, "--bin", bin]);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    if let Some(target_dir) = profile_dir.parent() {
        cmd.arg("--target-dir").arg(target_dir);
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    eprintln!("escher-bench: cargo build -p {package} --bin {bin} ({profile}) ...");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run cargo to build {bin}"))?;
    if !status.success() {
        bail!("building {bin} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_fields() {
        let status = "Name:\tescher-head\nVmHWM:\t  12345 kB\nVmRSS:\t   2048 kB\n";
        assert_eq!(parse_status_kib(status, "VmRSS"), Some(2048));
        assert_eq!(parse_status_kib(status, "VmHWM"), Some(12345));
        assert_eq!(parse_status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(status_field(me, "VmRSS").unwrap() > 0);
    }
}
