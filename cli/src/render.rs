//! How the CLI shows things: plain tables for people, JSON for scripts, and the small
//! formatting helpers (results, times, resource updates) the commands share.
//!
//! Tables use comfy-table with no borders (columns separated by spaces, like `kubectl`), so
//! that they read well and still `grep`/`awk` cleanly. Every `render_*` function returns a
//! `String`, so tests check exactly what a person would see.

use std::time::Duration;

use comfy_table::{Table, presets};
use escher_proto::types::utc_seconds;
use escher_proto::{
    CapacityOp, NodeId, NodeSpec, ResourceUpdate, TaskId, TaskResult, TaskState, TaskStatus,
};

/// A borderless table with this header.
pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header(header.to_vec());
    t
}

/// A two-column `key  value` table, for describing one thing.
pub(crate) fn key_values(rows: &[(&str, String)]) -> String {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    for (key, value) in rows {
        t.add_row(vec![format!("{key}:"), value.clone()]);
    }
    lines(&t)
}

/// A table's text, each line with trailing spaces removed, ending with a newline. Control
/// characters in its cells (an escape sequence in a task's name, from an older head that took
/// them) are shown escaped, never sent to the terminal.
pub(crate) fn lines(t: &Table) -> String {
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(&printable(line.trim_end()));
        out.push('\n');
    }
    out
}

/// `text` with every control character escaped (`\u{1b}`), so that a string someone else chose
/// cannot drive the terminal it is printed on.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// A node id, or `-` when there is none.
pub(crate) fn node(id: Option<NodeId>) -> String {
    id.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// What a task ended with, in words.
pub(crate) fn result(result: Option<&TaskResult>) -> String {
    match result {
        None => "-".to_string(),
        Some(TaskResult::Exited { code }) => format!("exit code {code}"),
        Some(TaskResult::Returned(bytes)) => format!("returned {}", hex_preview(bytes)),
        Some(TaskResult::Released) => "released".to_string(),
        Some(TaskResult::OutOfMemory {
            used_mib,
            limit_mib,
        }) => format!("out of memory ({used_mib} of {limit_mib} MiB)"),
        Some(TaskResult::Object { size, checksum }) => {
            format!("returned object of {size} bytes (crc32c {checksum:08x})")
        }
    }
}

/// `N bytes` and the first bytes in hex (`12 bytes: 0a0b0c...`).
pub(crate) fn hex_preview(bytes: &[u8]) -> String {
    const SHOWN: usize = 32;
    if bytes.is_empty() {
        return "0 bytes".to_string();
    }
    let hex = hex::encode(&bytes[..bytes.len().min(SHOWN)]);
    let more = if bytes.len() > SHOWN { "..." } else { "" };
    let unit = if bytes.len() == 1 { "byte" } else { "bytes" };
    format!("{} {unit}: {hex}{more}", bytes.len())
}

/// One line per task: id, state, node, result, reason. A task from its tombstone says that
/// retention evicted it, and when it finished.
pub(crate) fn statuses(list: &[TaskStatus]) -> String {
    let mut t = table(&["ID", "STATE", "NODE", "ATTEMPT", "RESULT", "REASON"]);
    for s in list {
        let (attempt, reason) = match s.finished_at_ms.filter(|_| s.evicted) {
            Some(at) => (
                "-".to_string(),
                format!("evicted by retention (finished {})", utc_seconds(at)),
            ),
            None => (s.attempt.to_string(), s.reason.clone().unwrap_or_default()),
        };
        t.add_row(vec![
            s.id.to_string(),
            s.state.to_string(),
            node(s.node),
            attempt,
            result(s.result.as_ref()),
            reason,
        ]);
    }
    lines(&t)
}

/// What to say on stderr about tasks that did not succeed (`task 3 failed: exited with code
/// 2`), one line each; empty when all succeeded. With the exit status, a script learns both
/// that something failed and which.
pub(crate) fn unsuccessful(list: &[TaskStatus]) -> String {
    list.iter()
        .filter(|s| s.state != TaskState::Succeeded)
        .map(|s| match &s.reason {
            Some(reason) => format!("error: task {} {}: {reason}\n", s.id, s.state),
            None => format!("error: task {} {}\n", s.id, s.state),
        })
        .collect()
}

/// The exit status for tasks that were waited for: success only if every one succeeded. A
/// single failed command task passes on its own exit code (1 to 255).
pub(crate) fn exit_status(list: &[TaskStatus]) -> std::process::ExitCode {
    let failed: Vec<&TaskStatus> = list
        .iter()
        .filter(|s| s.state != TaskState::Succeeded)
        .collect();
    match failed.as_slice() {
        [] => std::process::ExitCode::SUCCESS,
        [one] if list.len() == 1 => match one.result {
            Some(TaskResult::Exited { code }) if (1..=255).contains(&code) => {
                std::process::ExitCode::from(code as u8)
            }
            _ => std::process::ExitCode::FAILURE,
        },
        _ => std::process::ExitCode::FAILURE,
    }
}

/// Ids separated by spaces.
pub(crate) fn ids(list: &[TaskId]) -> String {
    let text: Vec<String> = list.iter().map(ToString::to_string).collect();
    text.join(" ")
}

/// A duration as people write it (`30s`, `1.5s`, `250ms`), or `-`.
pub(crate) fn duration(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), |d| format!("{d:?}"))
}

/// A time in milliseconds since the Unix epoch as UTC ISO 8601, `2025-01-02T03:04:05.678Z`.
pub(crate) fn time(ms: u64) -> String {
    escher_proto::types::utc_millis(ms)
}

/// A time in a table: `MM-DD HH:MM:SS` (UTC), or `-`.
pub(crate) fn short_time(ms: Option<u64>) -> String {
    // `YYYY-MM-DDTHH:MM:SS.mmmZ` → `MM-DD HH:MM:SS`.
    ms.map_or_else(
        || "-".to_string(),
        |ms| {
            let full = time(ms);
            format!("{} {}", &full[5..10], &full[11..19])
        },
    )
}

/// An optional time, or `-`.
pub(crate) fn maybe_time(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_string(), time)
}

/// A resource change in words: `set done-t1=1 on the task's node`.
pub(crate) fn update(u: &ResourceUpdate) -> String {
    let what = match u.op {
        CapacityOp::Set(capacity) => format!("set {}={capacity}", u.name),
        CapacityOp::Adjust(delta) => format!("adjust {} by {delta}", u.name),
        CapacityOp::Delete => format!("delete {}", u.name),
    };
    format!("{what} on {}", target(&u.target))
}

/// Where a resource change applies, in words.
pub(crate) fn target(spec: &NodeSpec) -> String {
    match spec {
        NodeSpec::Local => "the task's node".to_string(),
        NodeSpec::Node(id) => format!("node {id}"),
        NodeSpec::Match {
            resources,
            num_nodes,
        } => {
            let which = if resources.is_empty() {
                "every live node".to_string()
            } else {
                format!("nodes with {resources} available")
            };
            match num_nodes {
                Some(n) => format!("{which} (at most {n})"),
                None => which,
            }
        }
    }
}

/// Quotes an argument for display when a shell would need it.
pub(crate) fn shell_word(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("plain"), "plain");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        let mut t = table(&["NAME"]);
        t.add_row(vec!["x\u{7}y"]);
        assert!(lines(&t).contains("x\\u{7}y"), "{}", lines(&t));
    }

    #[test]
    fn times_are_utc_iso8601() {
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(maybe_time(None), "-");
        assert_eq!(short_time(Some(1_700_000_000_123)), "11-14 22:13:20");
        assert_eq!(short_time(None), "-");
    }

    #[test]
    fn results_and_words() {
        assert_eq!(result(Some(&TaskResult::Exited { code: 3 })), "exit code 3");
        assert_eq!(
            result(Some(&TaskResult::Returned(vec![0x0a, 0xff].into()))),
            "returned 2 bytes: 0aff"
        );
        assert!(hex_preview(&[0; 40]).ends_with("..."));
        assert_eq!(hex_preview(&[]), "0 bytes");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("--x=1"), "--x=1");
        let u = ResourceUpdate {
            name: "done-t1".parse().unwrap(),
            op: CapacityOp::Set("1".parse().unwrap()),
            target: NodeSpec::Local,
        };
        assert_eq!(update(&u), "set done-t1=1 on the task's node");
        let m = NodeSpec::Match {
            resources: "cpu=1".parse().unwrap(),
            num_nodes: Some(2),
        };
        assert_eq!(target(&m), "nodes with cpu=1 available (at most 2)");
    }

    #[test]
    fn an_evicted_task_says_so_and_when_it_finished() {
        let s = TaskStatus {
            id: TaskId(5),
            state: TaskState::Succeeded,
            node: None,
            attempt: 0,
            reason: None,
            result: None,
            evicted: true,
            finished_at_ms: Some(1_795_428_000_000),
            hook_errors: Vec::new(),
        };
        let text = statuses(std::slice::from_ref(&s));
        let row: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            [
                "5",
                "succeeded",
                "-",
                "-",
                "-",
                "evicted",
                "by",
                "retention",
                "(finished",
                "2026-11-23T10:00:00Z)"
            ],
            "{text}"
        );
        assert_eq!(exit_status(&[s]), std::process::ExitCode::SUCCESS);
    }

    #[test]
    fn exit_status_follows_the_tasks() {
        let s = |state, code| TaskStatus {
            id: TaskId(1),
            state,
            node: None,
            attempt: 1,
            reason: None,
            result: Some(TaskResult::Exited { code }),
            evicted: false,
            finished_at_ms: None,
            hook_errors: Vec::new(),
        };
        use std::process::ExitCode;
        assert_eq!(
            exit_status(&[s(TaskState::Succeeded, 0)]),
            ExitCode::SUCCESS
        );
        assert_eq!(exit_status(&[s(TaskState::Failed, 3)]), ExitCode::from(3));
        assert_eq!(exit_status(&[s(TaskState::Failed, 300)]), ExitCode::FAILURE);
        assert_eq!(
            exit_status(&[s(TaskState::Succeeded, 0), s(TaskState::Failed, 3)]),
            ExitCode::FAILURE
        );
    }
}
