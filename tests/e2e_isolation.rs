//! The tenant boundary at the task, against real `escher-head` and `escher-worker` processes
//! laid out as the README's tour lays them out (the worker beside the head, sharing its
//! `ESCHER_HOME`, and given the join token in `ESCHER_TOKEN` as on another machine).
//!
//! A tenant's command task must reach nothing of its worker's (the admin's access file, the
//! worker's identity and node secret, its join token, its logs) and nothing of another
//! tenant's (their processes' environments, their secrets and task credentials among them).
//! CI runs as root, so the workers there run each namespace's tasks as a user of their own; a
//! worker without that privilege says its tasks are not isolated, and `--require-isolation`
//! makes it refuse to start.

mod procs;

use std::collections::BTreeMap;
use std::time::Duration;

use escher::types::{Grant, LogStream, Role, TaskState, WatchRequest};
use escher::{Client, Task};
use escher_proto::types::ISOLATION_LABEL;
use procs::{ProcessCluster, WAIT, WorkerExtra, eventually};

/// A client of `namespace` with an app token for it.
async fn tenant(cluster: &ProcessCluster, admin: &Client, namespace: &str) -> Client {
    let grant = Grant::new(Role::App, Some(namespace.parse().unwrap())).unwrap();
    let token = admin.create_token(grant, namespace).await.unwrap().token;
    cluster.client().await.with_token(token)
}

/// The lines `key=value` a probe task printed, as a map.
fn answers(stdout: &[u8]) -> BTreeMap<String, String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_root_a_tenants_task_reaches_nothing_of_its_worker_or_of_other_tenants() {
    // A worker without root runs every task as its own user, and says so in its label (the
    // next test); this one is about the isolation root gives.
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (as CI has): tasks run as their namespace's user only under a root worker"
    );
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    let access = escher_proto::access::AccessFile::read(&cluster.access_file()).unwrap();
    // Started as docs/security.md says for another machine: the join token in ESCHER_TOKEN.
    cluster.next_workers(WorkerExtra {
        env: vec![("ESCHER_TOKEN".into(), access.worker_token.clone())],
        ..WorkerExtra::default()
    });
    cluster.start_worker("w1", "cpu=4").await;
    let admin = cluster.client().await;
    let node = admin.cluster_status().await.unwrap().nodes.remove(0);
    let isolated = node.labels.get(ISOLATION_LABEL) == Some("uid");
    assert!(isolated, "label {:?}", node.labels);

    let a = tenant(&cluster, &admin, "appa").await;
    let b = tenant(&cluster, &admin, "appb").await;
    // Its command line is what another tenant must not read in /proc.
    let secret = Task::command(["sleep", "60.123"])
        .env("B_DB_PASSWORD", "hunter2")
        .resources_str("cpu=1");
    let b_task = b.submit(secret).await.unwrap().id();
    eventually("tenant B's task to run", WAIT, || {
        let b = b.clone();
        async move {
            let info = b.task_info(b_task).await.ok()?;
            (info.status.state == TaskState::Running).then_some(())
        }
    })
    .await;

    let probe = format!(
        r#"
        printf 'worker_token=%s\n' "$(env | grep -c '^ESCHER_TOKEN=')"
        printf 'worker_home=%s\n' "$(env | grep -c '^ESCHER_HOME=')"
        printf 'access_file=%s\n' "$(cat {access} 2>/dev/null | grep -c admin_token)"
        printf 'identity=%s\n' "$(cat {state}/identity.json 2>/dev/null | grep -c secret)"
        printf 'worker_logs=%s\n' "$(ls {logs} 2>/dev/null | grep -c .)"
        printf 'b_secret=%s\n' "$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c B_DB_PASSWORD)"
        printf 'b_cmdline=%s\n' "$(cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -c '^60\.1[2]3$')"
        printf 'uid=%s\n' "$(id -u)"
        printf 'home_mode=%s\n' "$(stat -c %a "$HOME")"
        "#,
        access = cluster.access_file().display(),
        state = cluster.state_dir("w1").display(),
        logs = cluster.dir().join("w1.tasks").display(),
    );
    let a_task = a
        .submit(Task::command(["sh", "-c", &probe]).resources_str("cpu=1"))
        .await
        .unwrap();
    let (done, _) = a
        .wait([a_task.id()], 1, Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(done[0].state, TaskState::Succeeded, "{:?}", done[0]);
    let said = answers(&a.logs(a_task.id(), LogStream::Stdout).await.unwrap());
    // Whatever the user: the worker's own variables never reach a task.
    assert_eq!(said["worker_token"], "0", "{said:?}");
    assert_eq!(said["worker_home"], "0", "{said:?}");
    // Tasks run as their namespace's user: the worker's files and tenant B's processes are
    // closed to them.
    assert_eq!(said["access_file"], "0", "{said:?}");
    assert_eq!(said["identity"], "0", "{said:?}");
    assert_eq!(said["worker_logs"], "0", "{said:?}");
    assert_eq!(said["b_secret"], "0", "{said:?}");
    // Nor can it list B's processes: their command lines are not in its /proc.
    assert_eq!(said["b_cmdline"], "0", "{said:?}");
    assert!(said["uid"].parse::<u32>().unwrap() >= 300_000, "{said:?}");
    assert_eq!(said["home_mode"], "700", "{said:?}");
    b.cancel([b_task]).await.unwrap();
}

/// A worker that cannot change user says its tenants are not isolated, and refuses to start
/// when told to require isolation. As root, the test runs that worker as `nobody`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_isolate_says_so_or_refuses_to_start() {
    let root = nix::unistd::geteuid().is_root();
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    let access = escher_proto::access::AccessFile::read(&cluster.access_file()).unwrap();
    // The join token travels in the environment, never on the worker's command line.
    let as_nobody = WorkerExtra {
        env: vec![("ESCHER_TOKEN".into(), access.worker_token.clone())],
        uid: root.then_some(65_534),
        ..WorkerExtra::default()
    };
    cluster.next_workers(as_nobody.clone());
    cluster.start_worker("plain", "cpu=1").await;
    let admin = cluster.client().await;
    let status = admin.cluster_status().await.unwrap();
    assert_eq!(
        status.nodes[0].labels.get(ISOLATION_LABEL),
        Some("none"),
        "{:?}",
        status.nodes[0].labels
    );
    // `escher nodes`, as an admin runs it on the head's machine.
    let nodes = std::process::Command::new(procs::binary("escher"))
        .arg("nodes")
        .env("ESCHER_HOME", cluster.dir().join("escher-home"))
        .env_remove("ESCHER_HEAD")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&nodes.stdout);
    assert!(nodes.status.success(), "{nodes:?}");
    assert!(
        text.contains("tasks on plain share one user: tenants there are not isolated"),
        "{text}"
    );

    let mut strict = as_nobody;
    strict.args.push("--require-isolation".into());
    cluster.next_workers(strict);
    let exit = cluster.start_worker_expecting_exit("strict", "cpu=1").await;
    assert!(!exit.0.success(), "{:?}", exit.0);
    assert!(
        exit.1.contains("--require-isolation") && exit.1.contains("share the worker's user"),
        "{}",
        exit.1
    );
}

/// The next item of `watch` within `limit`: `Ok(None)` when it ended, `Err` when it is still
/// open and silent.
async fn watch_end(watch: &mut escher::Watch, limit: Duration) -> Result<String, ()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Err(_) => return Err(()),
            Ok(None) => return Ok("ended".into()),
            Ok(Some(Err(e))) => return Ok(e.to_string()),
            Ok(Some(Ok(_))) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_and_an_ended_attempt_close_their_open_streams() {
    let cluster = ProcessCluster::builder().workers(1).start().await;
    let admin = cluster.client().await;
    let grant = Grant::new(Role::App, Some("appa".parse().unwrap())).unwrap();
    let created = admin.create_token(grant, "appa").await.unwrap();
    let app = cluster.client().await.with_token(created.token.clone());
    let mut watch = app.watch(WatchRequest::all()).await.unwrap();
    // Opens the client's SubmitStream, which stays open for later submits.
    app.submit(Task::command(["true"]).resources_str("cpu=1"))
        .await
        .unwrap();
    let tasks_before = admin
        .list_tasks(Default::default(), None)
        .await
        .unwrap()
        .len();

    admin.revoke_token(created.info.id.clone()).await.unwrap();
    let revoked = std::time::Instant::now();
    // A submit on the stream opened before the revoke is refused, and nothing is created.
    let err = app
        .submit(Task::command(["true"]).resources_str("cpu=1"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    let tasks_after = admin
        .list_tasks(Default::default(), None)
        .await
        .unwrap()
        .len();
    assert_eq!(tasks_after, tasks_before);
    // The watch opened before it ends, saying why, within a second or so.
    let end = watch_end(&mut watch, Duration::from_secs(5))
        .await
        .expect("the revoked token's watch still open 5 s after the revoke");
    assert!(
        revoked.elapsed() < Duration::from_secs(2),
        "{:?}",
        revoked.elapsed()
    );
    assert!(end.contains("revoked"), "{end}");

    // A task credential's watch ends with its attempt.
    let task = admin
        .submit(
            Task::command(["sh", "-c", r#"echo "$ESCHER_TASK_TOKEN"; exec sleep 60"#])
                .resources_str("cpu=1"),
        )
        .await
        .unwrap()
        .id();
    let credential = eventually("the task to print its credential", WAIT, || {
        let admin = admin.clone();
        async move {
            let out = admin.logs(task, LogStream::Stdout).await.ok()?;
            let text = String::from_utf8(out).ok()?;
            let line = text.lines().next()?.trim().to_string();
            (!line.is_empty()).then_some(line)
        }
    })
    .await;
    let as_task = cluster.client().await.with_token(credential);
    let mut watch = as_task.watch(WatchRequest::all()).await.unwrap();
    admin.cancel([task]).await.unwrap();
    let cancelled = std::time::Instant::now();
    let end = watch_end(&mut watch, Duration::from_secs(10))
        .await
        .expect("a cancelled task's credential still watching 10 s later");
    assert!(end.contains("only while that attempt runs"), "{end}");
    assert!(
        cancelled.elapsed() < Duration::from_secs(8),
        "{:?}",
        cancelled.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_specs_and_a_workers_queue_are_bounded_in_bytes() {
    use escher::access::Bearer;
    use escher::types::{RegisterRequest, WorkerMessage};
    use escher_proto::wire::{self, worker_link_client::WorkerLinkClient};

    let mut_args = [
        "--max-task-bytes",
        "1100000",
        "--namespace-spec-bytes",
        "4000000",
    ];
    let cluster = ProcessCluster::builder()
        .workers(1)
        .resources("cpu=64")
        .head_args(&mut_args)
        .start()
        .await;
    let admin = cluster.client().await;
    let app = tenant(&cluster, &admin, "appa").await;
    let big = |bytes: usize| Task::command(["true", &"x".repeat(bytes)]).resources_str("cpu=1");

    // One task past the per-task limit is refused, naming the limit and its flag.
    let err = app.submit(big(2 << 20)).await.unwrap_err();
    assert!(err.to_string().contains("--max-task-bytes"), "{err}");
    // Three of 1 MiB fit the namespace's 4,000,000 bytes; the fourth does not.
    for _ in 0..3 {
        app.submit(big(1 << 20)).await.unwrap();
    }
    let err = app.submit(big(1 << 20)).await.unwrap_err();
    assert!(err.to_string().contains("--namespace-spec-bytes"), "{err}");

    // A worker that never reads its stream is cut off once its queue holds 64 MiB, and its
    // node is handled as lost: the head does not buffer for it without bound.
    let access = escher_proto::access::AccessFile::read(&cluster.access_file()).unwrap();
    let channel = tonic::transport::Endpoint::from_shared(cluster.head_url().to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut link = WorkerLinkClient::with_interceptor(channel, Bearer::new(&access.worker_token));
    let request = RegisterRequest {
        name: "sink".into(),
        address: "127.0.0.1".into(),
        resources: "cpu=1000,sink=1000".parse().unwrap(),
        labels: Default::default(),
        running: vec![],
        gpus: vec![],
        finished: vec![],
        identity: None,
        boot_id: 3,
    };
    let reply = link
        .register(wire::RegisterRequest::from(request))
        .await
        .unwrap()
        .into_inner();
    let reply = escher::types::RegisterReply::try_from(reply).unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let hello = WorkerMessage::Hello {
        node_id: reply.node_id,
        secret: reply.secret.unwrap(),
        interned_names: false,
    };
    tx.send(wire::WorkerBatch {
        messages: vec![hello.into()],
    })
    .await
    .unwrap();
    // Attached, and never read; but heartbeating, so that only the queue can give it away.
    let _unread = link
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    let beats = tokio::spawn({
        let tx = tx.clone();
        async move {
            loop {
                let beat = WorkerMessage::Heartbeat {
                    metrics: vec![],
                    seq: 0,
                    fence: None,
                    actors: vec![],
                };
                let batch = wire::WorkerBatch {
                    messages: vec![beat.into()],
                };
                if tx.send(batch).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    for _ in 0..100 {
        admin
            .submit(Task::command(["true", &"x".repeat(1 << 20)]).resources_str("sink=1"))
            .await
            .unwrap();
    }
    eventually(
        "the head to give up on the worker that does not read",
        WAIT,
        || {
            let admin = admin.clone();
            async move {
                let status = admin.cluster_status().await.ok()?;
                let sink = status.nodes.iter().find(|n| n.name == "sink")?;
                (!sink.alive).then_some(())
            }
        },
    )
    .await;
    beats.abort();
    drop(tx);
}

/// An idempotency key belongs to the credential that sent it: the same key from another caller
/// is another write, never the first caller's reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_is_scoped_to_its_caller() {
    use escher::access::Bearer;
    use escher_proto::wire::{self, cluster_client::ClusterClient};

    let cluster = ProcessCluster::builder().workers(1).start().await;
    let admin = cluster.client().await;
    let mut tokens = Vec::new();
    for ns in ["appa", "appb"] {
        let grant = Grant::new(Role::App, Some(ns.parse().unwrap())).unwrap();
        tokens.push(admin.create_token(grant, ns).await.unwrap().token);
    }
    let submit = |token: &str| {
        let bearer = Bearer::new(token);
        let url = cluster.head_url().to_string();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut rpc = ClusterClient::with_interceptor(channel, bearer);
            let task = Task::command(["true"])
                .resources_str("cpu=1")
                .build()
                .unwrap();
            let request = wire::SubmitRequest {
                tasks: vec![task.into()],
                namespace: String::new(),
                key: Some(wire::RequestKey {
                    client: 42,
                    seq: 1,
                    first_incomplete: 1,
                }),
            };
            rpc.submit(request).await.unwrap().into_inner().task_ids
        }
    };
    let a = submit(&tokens[0]).await;
    // A retry by the same caller is answered as before: the same task, not a second one.
    assert_eq!(submit(&tokens[0]).await, a);
    // The same key from another caller is that caller's own write.
    let b = submit(&tokens[1]).await;
    assert_eq!(b.len(), 1);
    assert_ne!(
        b, a,
        "another caller's key returned the first caller's reply"
    );
    let visible = cluster
        .client()
        .await
        .with_token(tokens[1].clone())
        .list_tasks(Default::default(), None)
        .await
        .unwrap();
    assert_eq!(visible.len(), 1, "{visible:?}");
}

/// `escher ARGS` as the admin on the head's machine would run it, with `access` as the access
/// file: (exit code, stdout, stderr).
fn cli(cluster: &ProcessCluster, access: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(procs::binary("escher"))
        .args(args)
        .env("ESCHER_ACCESS_FILE", access)
        .env("ESCHER_HOME", cluster.dir().join("no-such-home"))
        .env("ESCHER_HEAD", cluster.head_url())
        .env_remove("ESCHER_TOKEN")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_access_files_weak_tokens_and_control_characters_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mut cluster = ProcessCluster::builder().workers(0).start().await;
    let access = cluster.access_file();
    let (code, out, err) = cli(&cluster, &access, &["status"]);
    assert_eq!(code, 0, "{out}{err}");

    // A copy open to others is refused, with the fix named.
    let open = cluster.dir().join("open.json");
    std::fs::copy(&access, &open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, err) = cli(&cluster, &open, &["status"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("mode 644") && err.contains("chmod 600"),
        "{err}"
    );

    // A hand-written one-character token is refused as guessable.
    let weak = cluster.dir().join("weak.json");
    let mut file = escher_proto::access::AccessFile::read(&access).unwrap();
    file.admin_token = "x".into();
    escher_proto::access::write_credential_file(&weak, &file).unwrap();
    let (code, _, err) = cli(&cluster, &weak, &["status"]);
    assert_ne!(code, 0);
    assert!(err.contains("too easy to guess"), "{err}");

    // A task name that would drive the terminal of whoever lists tasks is refused.
    let admin = cluster.client().await;
    let err = admin
        .submit(Task::command(["true"]).name("\u{1b}]0;owned\u{7}\u{1b}[2J"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("control character"), "{err}");

    // `token create --out` never writes through a symbolic link, a dangling one included (it
    // would create the file wherever the link points), and creates no token for it.
    let tokens_before = admin.list_tokens().await.unwrap().len();
    let planted = cluster.dir().join("planted.json");
    let pointed = cluster.dir().join("where-the-link-points");
    std::os::unix::fs::symlink(&pointed, &planted).unwrap();
    let planted_arg = planted.display().to_string();
    let args = ["token", "create", "--role", "worker", "--out", &planted_arg];
    let (code, out, err) = cli(&cluster, &access, &args);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("symbolic link") && err.contains("remove what is there"),
        "{err}"
    );
    assert!(!pointed.exists(), "a token was written through the link");
    assert_eq!(admin.list_tokens().await.unwrap().len(), tokens_before);

    // docs/security.md's layout for a worker on another machine: a worker-only credential file,
    // never the admin's access file.
    let credential = cluster.dir().join("worker.json");
    let credential_arg = credential.display().to_string();
    let (code, out, err) = cli(
        &cluster,
        &access,
        &[
            "token",
            "create",
            "--role",
            "worker",
            "--out",
            &credential_arg,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("escher-worker --access-file"), "{out}");
    let mode = std::fs::metadata(&credential).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let written = escher_proto::access::AccessFile::read(&credential).unwrap();
    assert!(written.admin_token.is_empty() && !written.worker_token.is_empty());
    cluster.next_workers(WorkerExtra {
        args: vec!["--access-file".into(), credential_arg.clone()],
        ..WorkerExtra::default()
    });
    cluster.start_worker("remote", "cpu=1").await;
    // It cannot act as an admin: the file holds no admin token.
    let (code, _, err) = cli(&cluster, &credential, &["token", "list"]);
    assert_ne!(code, 0, "{err}");
}

/// Finding 4 against real processes: a tenant's hooks and ghosts cannot write another
/// namespace's or a shared resource, which `resource set` refuses too; and a worker given a
/// uid range it cannot use refuses to start, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_and_ghosts_write_only_their_own_namespace() {
    use escher::types::{NodeSpec, ResourceUpdate};
    use escher_client::ResourceUpdateExt as _;
    let mut cluster = ProcessCluster::builder().workers(1).start().await;
    let admin = cluster.client().await;
    let node = admin.cluster_status().await.unwrap().nodes[0].id;
    admin
        .set_resource("appb/pool", 2, NodeSpec::Node(node))
        .await
        .unwrap();
    admin
        .set_resource("shared/lic", 1, NodeSpec::Node(node))
        .await
        .unwrap();
    let a = tenant(&cluster, &admin, "appa").await;
    for target in ["appb/pool", "shared/lic"] {
        let raise = ResourceUpdate::adjust(target, 99_998, NodeSpec::Local).unwrap();
        let hook = Task::command(["true"])
            .resources_str("cpu=1")
            .on_start(raise);
        let err = a.submit(hook).await.unwrap_err();
        assert!(
            err.to_string().contains("belongs to another namespace"),
            "{err}"
        );
        let ghost = Task::ghost().creates(target, 7).resources_str("cpu=1");
        let err = a.submit(ghost).await.unwrap_err();
        assert!(
            err.to_string().contains("belongs to another namespace"),
            "{err}"
        );
    }
    let status = admin.cluster_status().await.unwrap();
    let total = |name: &str| status.nodes[0].resource(name).unwrap().total.to_string();
    assert_eq!(
        (total("appb/pool"), total("shared/lic")),
        ("2".into(), "1".into())
    );

    // A range holding the machine's own users is refused at start.
    cluster.next_workers(WorkerExtra {
        args: vec!["--task-uids".into(), "0-1000".into()],
        ..WorkerExtra::default()
    });
    let (status, text) = cluster
        .start_worker_expecting_exit("badrange", "cpu=1")
        .await;
    assert!(!status.success());
    assert!(
        text.contains("--task-uids") && text.contains("system users"),
        "{text}"
    );
}
