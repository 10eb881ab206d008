//! The `escher` CLI tells the truth (docs/DESIGN.md §9): exit codes that follow the tasks, unknown
//! options refused, deleting what does not exist said so, a reservation name in use refused,
//! unlimited retries printed as such. Each test drives the real `escher` binary against an
//! in-process cluster on loopback.

mod common;

use std::process::Output;

use common::{cluster, escher_bin, within};
use escher::LocalCluster;

/// Runs `escher ARGS` against `cluster` as its admin; returns (exit code, stdout, stderr).
fn escher(cluster: &LocalCluster, args: &[&str]) -> (i32, String, String) {
    let mut command = admin_command(cluster, args);
    command.env("ESCHER_HEAD", cluster.head_url());
    outcome(&mut command)
}

/// `escher ARGS` with the cluster's admin token and no access file or defaults file of the
/// machine's (`ESCHER_HOME` points nowhere).
fn admin_command(cluster: &LocalCluster, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(escher_bin());
    command
        .args(args)
        .env("ESCHER_TOKEN", cluster.admin_token())
        .env_remove("ESCHER_ACCESS_FILE")
        .env("ESCHER_HOME", "/nonexistent/escher-cli-test");
    command
}

/// Runs `command`; returns (exit code, stdout, stderr).
fn outcome(command: &mut std::process::Command) -> (i32, String, String) {
    let out: Output = command.output().expect("the escher CLI runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn start() -> LocalCluster {
    within("starting", cluster().workers(1).start())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_get_exit_non_zero_for_a_failed_task_and_say_which() {
    let cluster = start().await;
    let (code, ok, _) = escher(&cluster, &["submit", "--", "true"]);
    assert_eq!(code, 0);
    let (code, bad, _) = escher(&cluster, &["submit", "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, 0);
    let (ok, bad) = (ok.trim(), bad.trim());
    let (code, out, err) = escher(&cluster, &["wait", ok, bad]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("task {bad} failed: exited with code 3")),
        "{err}"
    );
    // With --num 1 both are reported as what they are once finished: never "not finished".
    let (code, out, _) = escher(&cluster, &["wait", ok, bad, "--num", "1"]);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("not finished"), "{out}");
    assert!(out.contains("failed") && out.contains("succeeded"), "{out}");
    // get passes the command's exit code on, and says why.
    let (code, _, err) = escher(&cluster, &["get", bad]);
    assert_eq!(code, 3);
    assert!(err.contains("exited with code 3"), "{err}");
    let (code, _, err) = escher(&cluster, &["get", ok]);
    assert_eq!((code, err.as_str()), (0, ""));
    // submit --wait too.
    let (code, _, err) = escher(&cluster, &["submit", "--wait", "--", "sh", "-c", "exit 4"]);
    assert_eq!(code, 4);
    assert!(err.contains("exited with code 4"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_option_before_the_command_is_refused() {
    let cluster = start().await;
    let (code, out, err) = escher(&cluster, &["submit", "-r", "cpu=1", "--wiat", "--", "echo"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--wiat"), "{err}");
    // After the command's first word, everything is the command's.
    let (code, id, err) = escher(&cluster, &["submit", "--wait", "echo", "-n", "--wiat"]);
    assert_eq!(code, 0, "{err}");
    let id = id.lines().next().unwrap().trim().to_string();
    let (_, log, _) = escher(&cluster, &["logs", &id]);
    assert_eq!(log, "--wiat");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_what_does_not_exist_and_reusing_a_reservation_name_are_said() {
    let cluster = start().await;
    let node = cluster.nodes()[0].to_string();
    let (code, out, err) = escher(
        &cluster,
        &["resource", "delete", "nothing", "--node", &node],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "no targeted node has nothing; nothing deleted\n");
    escher(
        &cluster,
        &["resource", "set", "thing", "2", "--node", &node],
    );
    let (_, out, _) = escher(&cluster, &["resource", "delete", "thing", "--node", &node]);
    assert_eq!(out, format!("changed node {node}\n"));

    let reserve = ["reserve", "r", "--bundle", "cpu=1", "--wait"];
    let (code, out, err) = escher(&cluster, &reserve);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = escher(&cluster, &reserve);
    assert_ne!(code, 0);
    assert!(err.contains("a reservation named r is in use"), "{err}");
    // A holder's retries are unlimited, and info says so in words.
    let holder = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("holders:"))
        .expect("holders line")
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let (_, info, _) = escher(&cluster, &["info", &holder]);
    assert!(info.contains("unlimited"), "{info}");
    assert!(!info.contains("4294967295"), "{info}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_lists_newest_first_filters_and_says_when_the_list_goes_on() {
    let cluster = start().await;
    let (code, _, err) = escher(
        &cluster,
        &[
            "submit", "--count", "3", "--wait", "--name", "train", "--", "true",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = escher(
        &cluster,
        &[
            "submit", "--wait", "--name", "eval", "--label", "team=a", "--", "true",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let ids = |out: &str| -> Vec<u64> {
        // Table rows are indented; the line about the rest is not.
        out.lines()
            .skip(1)
            .filter(|l| l.starts_with(' '))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    };
    // Newest first, with start and end times, and a line saying how to see the rest.
    let (_, out, _) = escher(&cluster, &["tasks", "--limit", "2"]);
    assert_eq!(ids(&out), [4, 3], "{out}");
    assert!(out.lines().next().unwrap().contains("STARTED"), "{out}");
    assert!(
        out.contains("2 shown, 2 more: --after 3 shows the next 2, --limit 0 shows all"),
        "{out}"
    );
    let (_, out, _) = escher(&cluster, &["tasks", "--limit", "2", "--after", "3"]);
    assert_eq!(ids(&out), [2, 1], "{out}");
    assert!(!out.contains("more"), "{out}");
    let (_, out, _) = escher(&cluster, &["tasks", "--oldest-first", "--limit", "1"]);
    assert_eq!(ids(&out), [1], "{out}");
    // Filters: name, label, node, state.
    let (_, out, _) = escher(&cluster, &["tasks", "--name", "rai"]);
    assert_eq!(ids(&out), [3, 2, 1], "{out}");
    let (_, out, _) = escher(&cluster, &["tasks", "--label", "team=a"]);
    assert_eq!(ids(&out), [4], "{out}");
    let node = cluster.nodes()[0].to_string();
    let (_, out, _) = escher(
        &cluster,
        &["tasks", "--node", &node, "--state", "succeeded"],
    );
    assert_eq!(ids(&out), [4, 3, 2, 1], "{out}");
    let (_, out, _) = escher(&cluster, &["tasks", "--node", "99"]);
    assert_eq!(out, "no tasks\n");
    // The namespace of --namespace.
    let (code, _, err) = escher(
        &cluster,
        &["--namespace", "team-b", "submit", "--wait", "--", "true"],
    );
    assert_eq!(code, 0, "{err}");
    let (_, out, _) = escher(&cluster, &["--namespace", "team-b", "tasks"]);
    assert_eq!(ids(&out), [5], "{out}");
    assert!(out.contains("team-b"), "{out}");
    let (code, _, err) = escher(&cluster, &["tasks", "--label", "=a"]);
    assert_eq!(code, 1);
    assert!(err.contains("give KEY=VALUE, or KEY"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_reads_any_attempt_and_info_lists_them() {
    let cluster = start().await;
    let script = r#"echo "attempt $ESCHER_ATTEMPT"; [ "$ESCHER_ATTEMPT" = 2 ]"#;
    let (code, out, err) = escher(
        &cluster,
        &[
            "submit",
            "--retries",
            "1",
            "--wait",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let id = out.lines().next().unwrap().trim().to_string();
    let (_, log, _) = escher(&cluster, &["logs", &id]);
    assert_eq!(log, "attempt 2\n");
    let (_, log, _) = escher(&cluster, &["logs", &id, "--attempt", "1"]);
    assert_eq!(log, "attempt 1\n");
    let (code, _, err) = escher(&cluster, &["logs", &id, "--attempt", "3"]);
    assert_ne!(code, 0);
    assert!(err.contains("there is no attempt 3"), "{err}");
    let (code, _, err) = escher(&cluster, &["logs", &id, "--attempt", "0"]);
    assert_eq!(code, 2, "{err}");
    let (_, info, _) = escher(&cluster, &["info", &id]);
    assert!(
        info.contains("attempt 1:") && info.contains("exited with code 1"),
        "{info}"
    );
    assert!(
        info.contains("attempt 2:") && info.contains("exited with code 0"),
        "{info}"
    );
    // What its node holds it to, as the node's labels say.
    let client = cluster.client().await.unwrap();
    let status = client.cluster_status().await.unwrap();
    let node = &status.nodes[0];
    let held = node
        .labels
        .get(escher::types::LIMITS_LABEL)
        .expect("the label");
    let expected = match node.labels.get(escher::types::LIMITS_MISSING_LABEL) {
        None => format!("held on node {}: {held}", node.name),
        Some(missing) => format!("held on node {}: {held}; NOT held: {missing}", node.name),
    };
    let limits = info
        .lines()
        .find(|l| l.trim_start().starts_with("limits"))
        .unwrap_or_else(|| panic!("no limits line: {info}"));
    assert!(
        limits.contains(&expected) || (held == "none" && limits.contains("none held")),
        "{limits} / {expected}"
    );
    // With each held limit's value for this task's request (the default `cpu=1`).
    if held.split('+').any(|h| h == "pids") {
        let pids = node
            .labels
            .get(escher::types::LIMITS_PIDS_LABEL)
            .expect("a node that holds pids says how many");
        assert!(
            limits.contains(&format!("processes: {pids} at once")),
            "{limits}"
        );
    }
    if held.split('+').any(|h| h == "cpu") {
        assert!(
            limits.contains("cpu: 1 CPU, a quota of 100.0 ms per 100 ms"),
            "{limits}"
        );
    }
    // A Rust function runs inside its worker: no limits of its own, and `info` says so (this
    // one waits: no worker has a function of that name).
    let function = client
        .submit(escher::Task::function(
            "cli-truth-no-such-function",
            Vec::new(),
        ))
        .await
        .unwrap()
        .id();
    let (_, info, err) = escher(&cluster, &["info", &function.0.to_string()]);
    assert!(
        info.lines().any(|l| l.trim_start().starts_with("limits")
            && l.contains("none of its own: a Rust function or actor runs inside its worker")),
        "{info}{err}"
    );
    client.cancel(vec![function]).await.unwrap();
    // Following a finished task prints its last attempt and ends.
    let (code, log, _) = escher(&cluster, &["logs", "-f", &id]);
    assert_eq!((code, log.as_str()), (0, "attempt 2\n"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_prints_until_the_task_ends() {
    let cluster = start().await;
    let script = "echo first; sleep 1; echo second";
    let (code, id, err) = escher(&cluster, &["submit", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = escher(&cluster, &["logs", "-f", id.trim()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "first\nsecond\n");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_status_of_one_node_and_completion_scripts() {
    let cluster = start().await;
    let node = cluster.nodes()[0].to_string();
    let (code, _, err) = escher(&cluster, &["submit", "--", "sleep", "30"]);
    assert_eq!(code, 0, "{err}");
    // One row per node, with its CPU use and the task running there.
    let out = common::within("the task to run", async {
        loop {
            let (_, out, _) = escher(&cluster, &["nodes"]);
            if out.lines().nth(1).is_some_and(|l| l.contains("1 / ")) {
                return out;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NODE", "NAME", "ALIVE", "CPU", "MEMORY", "GPU", "OTHER", "RUNNING", "LABELS"
        ]
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[0], node, "{out}");
    assert_eq!(row[2], "yes", "{out}");
    let (code, json, _) = escher(&cluster, &["--json", "nodes"]);
    assert_eq!(code, 0);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows[0]["running"], 1, "{json}");
    // status of one node; an unknown one is an error that says where to look.
    let (code, out, _) = escher(&cluster, &["status", "--node", &node]);
    assert_eq!(code, 0);
    assert!(out.starts_with("1 nodes"), "{out}");
    let (code, _, err) = escher(&cluster, &["status", "--node", "99"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no node 99") && err.contains("escher nodes --all"),
        "{err}"
    );
    // Completion scripts for each shell, without a head.
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef escher"),
        ("fish", "complete -c escher"),
    ] {
        let (code, script, err) = escher(&cluster, &["completion", shell]);
        assert_eq!(code, 0, "{err}");
        assert!(script.contains(marker), "{shell}: {script:.200}");
        assert!(
            script.contains("nodes") && script.contains("attempt"),
            "{shell}"
        );
    }
    escher(&cluster, &["cancel", "1"]);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_file_gives_head_namespace_and_output_and_flags_win() {
    let cluster = start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "head = \"{}\"\nnamespace = \"team-c\"\noutput = \"json\"\n",
            cluster.head_url()
        ),
    )
    .unwrap();
    let run = |args: &[&str], config: &std::path::Path| {
        let mut command = admin_command(&cluster, args);
        command
            .env("ESCHER_CONFIG", config)
            .env_remove("ESCHER_HEAD")
            .env_remove("ESCHER_NAMESPACE");
        outcome(&mut command)
    };
    // The head and the namespace come from the file; the output is JSON.
    let (code, _, err) = run(&["submit", "--wait", "--", "true"], &config);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&["tasks"], &config);
    assert_eq!(code, 0, "{err}");
    let tasks: serde_json::Value = serde_json::from_str(&out).expect("JSON from the file's output");
    assert_eq!(tasks[0]["namespace"], "team-c", "{out}");
    // A flag wins over the file.
    let (code, out, _) = run(&["--namespace", "other", "tasks"], &config);
    assert_eq!((code, out.trim()), (0, "[]"));
    // A bad file is an error that names it.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "hed = \"x\"\n").unwrap();
    let (code, _, err) = run(&["tasks"], &bad);
    assert_eq!(code, 1);
    assert!(err.contains("bad.toml") && err.contains("hed"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_watch_prints_the_events_of_the_tasks_it_selects() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let cluster = start().await;
    let mut child = admin_command(&cluster, &["tasks", "--watch", "--label", "team=a"])
        .env("ESCHER_HEAD", cluster.head_url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the escher CLI starts");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next = || {
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("a line from escher tasks --watch")
    };
    // The list comes first (empty); the subscription is in place before it.
    assert_eq!(next(), "no tasks");
    let labelled = ["submit", "--label", "team=a", "--", "sh", "-c", "exit 2"];
    let (code, id, _) = escher(&cluster, &labelled);
    assert_eq!(code, 0);
    let (code, _, _) = escher(&cluster, &["submit", "--wait", "--", "true"]);
    assert_eq!(code, 0);
    let id = id.trim();
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("failed")) {
        lines.push(next());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines[0].ends_with(&format!("task {id} (sh) submitted")),
        "{lines:?}"
    );
    assert!(
        lines[1].contains(&format!("task {id} attempt 1 started on node")),
        "{lines:?}"
    );
    assert!(
        lines[2].contains(&format!("task {id} failed: exited with code 2")),
        "{lines:?}"
    );
    assert_eq!(
        lines.len(),
        3,
        "the unlabelled task is not shown: {lines:?}"
    );

    // Bounded, and as JSON lines.
    let (code, out, err) = escher(
        &cluster,
        &[
            "--json",
            "tasks",
            "--watch-for",
            "300ms",
            "--label",
            "team=a",
        ],
    );
    assert_eq!(code, 0, "{err}");
    // One JSON object per line: the listed tasks (those of team a), then no event.
    let objects: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?} in {out}")))
        .collect();
    assert!(!objects.is_empty(), "{out}");
    assert!(
        objects.iter().all(|o| o.is_object() && o["id"].is_u64()),
        "{out}"
    );
    let (code, _, err) = escher(&cluster, &["tasks", "--watch", "--name", "x"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("--name and --node"), "{err}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_once_counts_tasks_by_namespace_and_shows_the_nodes() {
    let cluster = start().await;
    let (code, _, err) = escher(
        &cluster,
        &["submit", "--count", "2", "--wait", "--", "true"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = escher(
        &cluster,
        &[
            "--namespace",
            "team-a",
            "submit",
            "--resources",
            "cpu=64",
            "--",
            "true",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = escher(&cluster, &["top", "--once"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("escher top · "), "{out}");
    assert!(out.contains("1 node live · 0 running · 1 pending"), "{out}");
    assert!(out.contains("queue: 1 pending"), "{out}");
    let row = |first: &str| -> Vec<String> {
        out.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|cells| cells.first().map(String::as_str) == Some(first))
            .unwrap_or_else(|| panic!("no row {first}: {out}"))
    };
    // NAMESPACE PENDING RUNNING SUCCEEDED FAILED CANCELLED
    assert_eq!(row("-")[1..], ["0", "0", "2", "0", "0"], "{out}");
    assert_eq!(row("team-a")[1..], ["1", "0", "0", "0", "0"], "{out}");
    // The nodes table of `escher nodes`: the one node, idle.
    assert_eq!(row("1")[1..4], ["local-0", "yes", "0"], "{out}");

    let (code, out, err) = escher(&cluster, &["--json", "top", "--once"]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(json["pending"], 1);
    assert_eq!(
        json["namespaces"].as_array().map(Vec::len),
        Some(2),
        "{json}"
    );
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(1), "{json}");
    cluster.shutdown().await;
}

/// A relay on a port of its own that forwards every connection to `to`, byte for byte (as a
/// program squatting a port, or a proxy, would), and keeps what the client sent it.
fn relay(to: std::net::SocketAddr) -> (String, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = std::sync::Arc::clone(&seen);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = std::net::TcpStream::connect(to) else {
                return;
            };
            let (mut client_back, mut server_back) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let kept = std::sync::Arc::clone(&kept);
            std::thread::spawn(move || {
                let mut buf = [0; 8192];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 || server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    kept.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = server.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut server_back, &mut client_back);
                let _ = client_back.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (address, seen)
}

/// `POST /api/login` at `base` with `ticket`: (HTTP status, body).
fn login(base: &str, ticket: &str) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .post(format!("http://{base}/api/login"))
        .header("content-type", "application/json")
        .send(serde_json::json!({ "ticket": ticket }).to_string())
        .expect("the dashboard answers");
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&body).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_prints_a_single_use_ticket_for_the_heads_own_address_never_the_token() {
    let addr = common::free_addr();
    let config = escher_head::HeadConfig {
        dashboard: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within("starting", cluster().workers(1).head_config(config).start())
        .await
        .unwrap();
    let (code, out, err) = escher(&cluster, &["dashboard", "--view", "gpus"]);
    assert_eq!(code, 0, "{err}");
    let url = out.trim();
    assert!(!url.contains(cluster.admin_token()), "{url}");
    let ticket = url
        .strip_prefix(&format!("http://{addr}/#ticket="))
        .and_then(|rest| rest.strip_suffix("&view=gpus"))
        .unwrap_or_else(|| panic!("not the head's address with a ticket: {url}"));
    assert_eq!(ticket.len(), 64, "{ticket}");
    assert!(err.contains("ESCHER_TOKEN"), "{err}");

    // Through a relay on another port, the ticket is refused (and spent): the relay gets no
    // session, and the bytes it saw hold no token.
    let (relayed, seen) = relay(addr);
    let (status, body) = login(&relayed, ticket);
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("own address"),
        "{body}"
    );
    assert!(body.get("session").is_none(), "{body}");
    let (status, _) = login(&addr.to_string(), ticket);
    assert_eq!(status, 401, "a ticket presented once is spent");
    let relay_saw = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    assert!(!relay_saw.contains(cluster.admin_token()), "{relay_saw}");

    // At the head's address, a fresh ticket works once: its session acts as the admin.
    let (_, out, _) = escher(&cluster, &["dashboard"]);
    let ticket = out.trim().rsplit("#ticket=").next().unwrap().to_string();
    let (status, body) = login(&addr.to_string(), &ticket);
    assert_eq!(status, 200, "{body}");
    let session = body["session"].as_str().unwrap().to_string();
    assert!(session.starts_with("escher-dash-"), "{session}");
    assert!(!session.contains(cluster.admin_token()));
    let mut who = ureq::get(format!("http://{addr}/api/whoami"))
        .header("authorization", &format!("Bearer {session}"))
        .call()
        .expect("the session is accepted");
    let who: serde_json::Value =
        serde_json::from_str(&who.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(who["role"], "admin", "{who}");
    let (status, body) = login(&addr.to_string(), &ticket);
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("already used"),
        "{body}"
    );

    // Named at another address (here the relay's), the CLI prints nothing and never contacts it.
    let before = seen.lock().unwrap().len();
    let (code, out, err) = escher(&cluster, &["dashboard", "--address", &relayed]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out, "");
    assert!(
        err.contains(&format!(
            "the head serves its dashboard at {addr}, not at {relayed}"
        )),
        "{err}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "the CLI sent the relay nothing"
    );

    // A view the page does not have is refused.
    let (code, out, err) = escher(&cluster, &["dashboard", "--view", "nosuch"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("nosuch"), "{err}");
    cluster.shutdown().await;

    // A head that serves no dashboard says so, and how to start one.
    let plain = within("starting", common::cluster().workers(0).start())
        .await
        .unwrap();
    let (code, out, err) = escher(&plain, &["dashboard"]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(out, "", "no address is printed");
    assert!(
        err.contains("this head serves no dashboard") && err.contains("--dashboard"),
        "{err}"
    );
    plain.shutdown().await;
}

/// A reader token runs what docs/security.md says it may: `status`, `nodes` and `top` (it sees no
/// task, and the commands say so instead of failing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_token_runs_status_nodes_and_top() {
    use escher::types::{Grant, Role};
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    admin
        .submit(escher::Task::command(["sleep", "30"]).resources_str("cpu=1000"))
        .await
        .unwrap();
    let reader = admin
        .create_token(Grant::new(Role::Reader, None).unwrap(), "dash")
        .await
        .unwrap()
        .token;
    for args in [
        &["status"][..],
        &["nodes"],
        &["top", "--once"],
        &["--json", "status"],
    ] {
        let mut command = admin_command(&cluster, args);
        command
            .env("ESCHER_TOKEN", &reader)
            .env("ESCHER_HEAD", cluster.head_url());
        let (code, out, err) = outcome(&mut command);
        assert_eq!(code, 0, "escher {args:?} with a reader token: {out}{err}");
    }
    let mut command = admin_command(&cluster, &["status"]);
    command
        .env("ESCHER_TOKEN", &reader)
        .env("ESCHER_HEAD", cluster.head_url());
    let (_, out, _) = outcome(&mut command);
    assert!(out.contains("a reader token sees no tasks"), "{out}");
    cluster.shutdown().await;
}

/// `escher telemetry` of a task that never existed is an error, not an empty answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_of_an_unknown_task_is_an_error() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let (code, out, err) = escher(&cluster, &["telemetry", "999999"]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("unknown task"), "{err}");
    cluster.shutdown().await;
}

/// Each binary's `--version` names the version and the commit it was built from: built from a
/// git checkout (as this test is, when `git` finds one here) a commit hash, never `unknown`.
#[test]
fn every_binary_prints_its_version_and_commit() {
    let dir = escher_bin().parent().unwrap().to_path_buf();
    let in_a_checkout = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .is_ok_and(|out| out.status.success());
    for name in ["escher", "escher-head", "escher-worker"] {
        let out = std::process::Command::new(dir.join(name))
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let prefix = format!("{name} {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(text.starts_with(&prefix), "{text}");
        let commit = text[prefix.len()..].trim_end().trim_end_matches(')');
        let hash = commit.trim_end_matches("+changes");
        if in_a_checkout {
            assert!(
                hash.len() == 12 && hash.chars().all(|c| c.is_ascii_hexdigit()),
                "{name} was built in a git checkout and names no commit: {text}"
            );
        } else {
            assert_eq!(hash, "unknown", "{text}");
        }
    }
}
