//! Keeping the tasks of one node apart from the worker and from each other: what a command
//! task starts with (its environment) and whom it runs as (its user).
//!
//! A task starts with nothing of its worker's: [`task_base_env`] keeps only a short list of
//! harmless variables (`PATH`, the locale, `TZ`, `TERM`, `TMPDIR`, and what `--pass-env`
//! names); the worker's `ESCHER_TOKEN`, `ESCHER_HOME` and the rest never reach a task.
//!
//! A worker that may change user (root, or `CAP_SETUID`, `CAP_SETGID` and `CAP_CHOWN`) runs
//! each namespace's command tasks as a user of their own ([`Isolation::PerUser`]): uid and gid
//! `first + n` of the configured range (`--task-uids`, 300000-365535 by default), allocated the
//! first time the namespace runs a task here and kept in the worker's state directory so that
//! the namespace keeps its user across the worker's restarts. The admin's tasks (no namespace)
//! and the `shared` namespace get users of their own too. Each user has a private directory,
//! 0700 and its own, that is its tasks' `HOME` and default working directory; the worker's
//! state, its logs (0700, files 0600) and other tenants' directories are closed to it, and
//! `/proc/PID/environ` of another user's process is unreadable. A worker that cannot change
//! user runs every task as itself ([`Isolation::Shared`]) and says so: at start, and in its
//! node's [`ISOLATION_LABEL`](escher_proto::types::ISOLATION_LABEL) that `escher nodes`,
//! `status` and the dashboard show.
//!
//! Kubernetes draws the same line at the pod (`runAsUser`), systemd at a dynamic user.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;

/// Variables of the worker's own environment that every command task gets, besides those
/// whose name starts with `LC_`. Everything else stays with the worker.
pub const PASSED_ENV: &[&str] = &["PATH", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR"];

/// The uids (and gids) tasks run as unless `--task-uids` says otherwise: above the ranges that
/// distributions give to people and systemd gives to its dynamic users (61184-65519), below
/// those of container user namespaces (from 524288).
pub const DEFAULT_TASK_UIDS: UidRange = UidRange {
    first: 300_000,
    last: 365_535,
};

/// The variables of the worker's environment (`vars`) that a command task starts with: those
/// of [`PASSED_ENV`], `LC_*`, and the names in `pass` (`--pass-env`).
pub fn task_base_env(
    vars: impl IntoIterator<Item = (String, String)>,
    pass: &[String],
) -> Vec<(String, String)> {
    vars.into_iter()
        .filter(|(k, _)| {
            PASSED_ENV.contains(&k.as_str()) || k.starts_with("LC_") || pass.contains(k)
        })
        .collect()
}

/// A range of uids, each used as the gid too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// The last uid, included.
    pub last: u32,
}

impl UidRange {
    /// How many users the range holds.
    pub fn len(&self) -> u64 {
        u64::from(self.last) - u64::from(self.first) + 1
    }

    /// Never: a range holds at least one uid.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }
}

impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Whom a worker runs its command tasks as (`--task-uids`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskUsers {
    /// One user per namespace from [`DEFAULT_TASK_UIDS`] when the worker may change user,
    /// else the worker's own user (and a warning).
    #[default]
    Auto,
    /// Every task as the worker's own user.
    Off,
    /// One user per namespace from this range; the worker refuses to start if it may not
    /// change user.
    Range(UidRange),
}

impl FromStr for TaskUsers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => return Ok(TaskUsers::Auto),
            "off" => return Ok(TaskUsers::Off),
            _ => {}
        }
        let usage = "write auto, off, or a range such as 300000-365535";
        let (first, last) = s
            .split_once('-')
            .ok_or_else(|| format!("{s:?} is not a uid range; {usage}"))?;
        let parse = |n: &str| {
            n.trim()
                .parse::<u32>()
                .map_err(|_| format!("{n:?} in {s:?} is not a uid; {usage}"))
        };
        let range = UidRange {
            first: parse(first)?,
            last: parse(last)?,
        };
        if range.first > range.last {
            return Err(format!("{s:?} ends before it starts; {usage}"));
        }
        // 0..1000 are the system's own users; 65534 is nobody, u32::MAX means "no change" to
        // setuid(2).
        if range.first < 1000 || range.contains(65_534) || range.last >= u32::MAX - 1 {
            return Err(format!(
                "{s:?} holds system users (below 1000, 65534 nobody, or {}); {usage}",
                u32::MAX - 1
            ));
        }
        Ok(TaskUsers::Range(range))
    }
}

impl fmt::Display for TaskUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskUsers::Auto => f.write_str("auto"),
            TaskUsers::Off => f.write_str("off"),
            TaskUsers::Range(r) => r.fmt(f),
        }
    }
}

/// The user a command task runs as, and its private directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskUser {
    /// Its uid, also its gid.
    pub uid: u32,
    /// Its directory: `HOME` and the default working directory, 0700 and its own.
    pub home: PathBuf,
    /// `setpriv` (util-linux), when this machine has it. Used only where the worker spawns
    /// through the standard library (a kernel without pidfds; elsewhere the one-exec spawn of
    /// `spawn.rs` changes user itself): the command starts through it, which changes user and
    /// then executes the program, so that the worker spawns with `vfork` (posix_spawn) instead
    /// of copying its whole address space with `fork`. `None` changes user in a forked child.
    pub switch: Option<PathBuf>,
}

/// How a worker keeps its command tasks apart.
#[derive(Debug)]
pub enum Isolation {
    /// Every task runs as the worker's user; the reason says why.
    Shared {
        /// Why, for the worker's warning and its node's label.
        why: String,
    },
    /// Each namespace's tasks run as a user of their own.
    PerUser(UserPool),
}

impl Isolation {
    /// Decides how to isolate from the setting, and whether this process may change user.
    /// `state_dir` keeps the namespaces' users across restarts; their homes are made in
    /// `task_dir` (`None`: the system's temporary directory); a range given explicitly that
    /// cannot be used (no privilege, or users of this machine inside it) is an error that
    /// names the cause.
    pub fn resolve(
        users: TaskUsers,
        state_dir: Option<&Path>,
        task_dir: Option<&Path>,
    ) -> Result<Isolation, String> {
        let range = match users {
            TaskUsers::Off => {
                return Ok(Isolation::Shared {
                    why: "--task-uids off".into(),
                });
            }
            TaskUsers::Auto => match may_change_user() {
                Ok(()) => DEFAULT_TASK_UIDS,
                Err(why) => return Ok(Isolation::Shared { why }),
            },
            TaskUsers::Range(range) => {
                may_change_user()
                    .map_err(|why| format!("{range} cannot be used: {why}; run it as root"))?;
                range
            }
        };
        if let Some((name, uid)) = users_in(range) {
            return Err(format!(
                "the task uid range {range} holds {name} (uid {uid}), a user of this machine; \
                 choose a range no account uses with --task-uids"
            ));
        }
        UserPool::open(range, state_dir, task_dir).map(Isolation::PerUser)
    }

    /// Whether tenants' tasks run as users of their own.
    pub fn isolated(&self) -> bool {
        matches!(self, Isolation::PerUser(_))
    }

    /// The value of the node's isolation label: `uid`, or `none`.
    pub fn label(&self) -> &'static str {
        match self {
            Isolation::PerUser(_) => "uid",
            Isolation::Shared { .. } => "none",
        }
    }

    /// The user for a task of `namespace` (`None`: an admin's task), or `None` when tasks share
    /// the worker's user. The error says why the task cannot run (the range is used up, the
    /// directory cannot be made).
    pub fn user_for(&self, namespace: Option<&str>) -> Result<Option<TaskUser>, String> {
        match self {
            Isolation::Shared { .. } => Ok(None),
            Isolation::PerUser(pool) => pool.user_for(namespace).map(Some),
        }
    }
}

/// The users of one worker's namespaces.
#[derive(Debug)]
pub struct UserPool {
    range: UidRange,
    /// Namespace (`""` for the admin's tasks) to uid.
    assigned: Mutex<BTreeMap<String, u32>>,
    /// Where `assigned` is kept, if anywhere.
    file: Option<PathBuf>,
    /// `setpriv`, if found (see [`TaskUser::switch`]).
    switch: Option<PathBuf>,
    /// The parent of the users' directories: 0711, so that each user reaches its own and lists
    /// none. Removed with the worker.
    homes: tempfile::TempDir,
    /// The uids whose directory is made and given to them already: a task of theirs costs no
    /// `mkdir`, `chown` or `chmod` (only its user can change the directory's mode since, and
    /// no task can remove it from the worker's 0711 parent).
    homes_made: Mutex<std::collections::BTreeSet<u32>>,
}

/// The file in the worker's state directory that keeps its namespaces' users.
const USERS_FILE: &str = "task-users.json";

impl UserPool {
    fn open(
        range: UidRange,
        state_dir: Option<&Path>,
        task_dir: Option<&Path>,
    ) -> Result<UserPool, String> {
        let file = state_dir.map(|dir| dir.join(USERS_FILE));
        let assigned = match &file {
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                    format!(
                        "{} is damaged ({e}); remove it to start over",
                        path.display()
                    )
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
                Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
            },
            None => BTreeMap::new(),
        };
        let temp = std::env::temp_dir();
        let homes = tempfile::Builder::new()
            .prefix("escher-tasks-")
            .tempdir_in(task_dir.unwrap_or(&temp))
            .map_err(|e| format!("cannot create the tasks' directories: {e}"))?;
        std::fs::set_permissions(homes.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("cannot set {}'s mode: {e}", homes.path().display()))?;
        Ok(UserPool {
            range,
            assigned: Mutex::new(assigned),
            file,
            switch: which::which("setpriv").ok(),
            homes,
            homes_made: Mutex::default(),
        })
    }

    /// The range the users come from.
    pub fn range(&self) -> UidRange {
        self.range
    }

    fn user_for(&self, namespace: Option<&str>) -> Result<TaskUser, String> {
        let key = namespace.unwrap_or("");
        let uid = {
            let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
            match assigned.get(key) {
                Some(&uid) if self.range.contains(uid) => uid,
                _ => {
                    let used: std::collections::BTreeSet<u32> =
                        assigned.values().copied().collect();
                    let uid = (self.range.first..=self.range.last)
                        .find(|id| !used.contains(id))
                        .ok_or_else(|| {
                            format!(
                                "the worker's task uid range {} is used up ({} namespaces ran \
                                 here); give it a wider --task-uids",
                                self.range,
                                assigned.len()
                            )
                        })?;
                    assigned.insert(key.to_string(), uid);
                    if let Some(file) = &self.file {
                        save(file, &assigned)?;
                    }
                    uid
                }
            }
        };
        let home = self.homes.path().join(uid.to_string());
        let made = |set: &std::collections::BTreeSet<u32>| set.contains(&uid);
        if made(&self.homes_made.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(TaskUser {
                uid,
                home,
                switch: self.switch.clone(),
            });
        }
        match std::fs::create_dir(&home) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", home.display())),
        }
        chown(&home, Some(uid), Some(uid))
            .and_then(|()| std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| format!("cannot give {} to uid {uid}: {e}", home.display()))?;
        self.homes_made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid);
        Ok(TaskUser {
            uid,
            home,
            switch: self.switch.clone(),
        })
    }
}

/// Writes the namespaces' users through a temporary file, so that a crash leaves the old file
/// or the new one.
fn save(file: &Path, assigned: &BTreeMap<String, u32>) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(assigned).map_err(|e| e.to_string())?;
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)))
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))
}

/// Whether this process may run children as other users and give them directories: root, or
/// the capabilities that take (`CAP_SETUID`, `CAP_SETGID`, `CAP_CHOWN`). The error says what is
/// missing.
fn may_change_user() -> Result<(), String> {
    const CHOWN: u64 = 1 << 0;
    const SETGID: u64 = 1 << 6;
    const SETUID: u64 = 1 << 7;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
    match effective {
        Some(caps) if caps & (CHOWN | SETGID | SETUID) == CHOWN | SETGID | SETUID => Ok(()),
        Some(_) => Err(format!(
            "the worker runs as uid {} without CAP_SETUID, CAP_SETGID and CAP_CHOWN",
            nix::unistd::geteuid()
        )),
        None => Err("the worker cannot read its capabilities from /proc/self/status".into()),
    }
}

/// The first account of this machine (`/etc/passwd`) whose uid falls in `range`.
fn users_in(range: UidRange) -> Option<(String, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let uid = fields.nth(1)?.parse::<u32>().ok()?;
        range.contains(uid).then(|| (name.to_string(), uid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_variables_pass() {
        let vars = [
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("ESCHER_TOKEN", "secret"),
            ("ESCHER_HOME", "/root/.escher"),
            ("HOME", "/root"),
            ("MY_VAR", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let got = task_base_env(vars.clone(), &[]);
        let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "LC_ALL"]);
        let got = task_base_env(vars, &["MY_VAR".to_string()]);
        assert!(got.contains(&("MY_VAR".into(), "1".into())));
    }

    #[test]
    fn ranges_parse_and_bad_ones_are_refused_with_the_reason() {
        assert_eq!("auto".parse(), Ok(TaskUsers::Auto));
        assert_eq!("off".parse(), Ok(TaskUsers::Off));
        assert_eq!(
            "300000-300009".parse(),
            Ok(TaskUsers::Range(UidRange {
                first: 300_000,
                last: 300_009
            }))
        );
        for (bad, says) in [
            ("300009-300000", "ends before it starts"),
            ("0-100", "system users"),
            ("60000-70000", "system users"),
            ("x-y", "not a uid"),
            ("300000", "not a uid range"),
        ] {
            let e = bad.parse::<TaskUsers>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn off_shares_the_worker_user() {
        let iso = Isolation::resolve(TaskUsers::Off, None, None).unwrap();
        assert!(!iso.isolated());
        assert_eq!(iso.label(), "none");
        assert_eq!(iso.user_for(Some("a")).unwrap(), None);
    }

    /// Run as root (CI), this allocates real users; elsewhere it checks the refusal.
    #[test]
    fn namespaces_get_users_of_their_own_kept_across_restarts() {
        let range = UidRange {
            first: 300_100,
            last: 300_102,
        };
        let state = tempfile::tempdir().unwrap();
        let pool = match Isolation::resolve(TaskUsers::Range(range), Some(state.path()), None) {
            Ok(Isolation::PerUser(pool)) => pool,
            Ok(Isolation::Shared { .. }) => unreachable!("an explicit range never shares"),
            Err(e) => {
                assert!(may_change_user().is_err(), "{e}");
                assert!(e.contains("run it as root"), "{e}");
                return;
            }
        };
        let a = pool.user_for(Some("a")).unwrap();
        let admin = pool.user_for(None).unwrap();
        let b = pool.user_for(Some("b")).unwrap();
        assert_eq!([a.uid, admin.uid, b.uid], [300_100, 300_101, 300_102]);
        assert_eq!(pool.user_for(Some("a")).unwrap(), a);
        let meta = std::fs::metadata(&a.home).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((meta.uid(), meta.mode() & 0o777), (300_100, 0o700));
        let e = pool.user_for(Some("c")).unwrap_err();
        assert!(e.contains("used up") && e.contains("--task-uids"), "{e}");
        drop(pool);
        // A restarted worker gives each namespace the user it had.
        let Isolation::PerUser(pool) =
            Isolation::resolve(TaskUsers::Range(range), Some(state.path()), None).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(pool.user_for(Some("b")).unwrap().uid, 300_102);
    }
}
