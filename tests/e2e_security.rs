//! Security and tenancy (docs/DESIGN.md §10), tried as an attacker would: the raw gRPC protocol
//! (tonic clients generated from `escher-proto`) against a real head and real workers on
//! loopback. Every attack must be refused with UNAUTHENTICATED or PERMISSION_DENIED (or
//! "unknown task" across namespaces), and the cluster's status and tasks must be unchanged.

mod common;

use std::time::Duration;

use common::{cluster, finished, running, status, within};
use escher::access::Bearer;
use escher::types::{
    ClusterStatus, GangStrategy, Grant, LogStream, NodeId, NodeSpec, RegisterRequest, ResourceSet,
    Role, TaskFinished, TaskResult, TaskState, TaskSummary, WorkerMessage,
};
use escher::{Client, ClientError, LocalCluster, Task};
use escher_head::HeadConfig;
use escher_proto::wire::worker_link_client::WorkerLinkClient;
use escher_proto::wire::{self, cluster_client::ClusterClient, raft_client::RaftClient};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

type Rpc = ClusterClient<InterceptedService<Channel, Bearer>>;
type Link = WorkerLinkClient<InterceptedService<Channel, Bearer>>;

async fn channel(cluster: &LocalCluster) -> Channel {
    within(
        "connecting",
        Endpoint::from_shared(cluster.head_url().to_string())
            .unwrap()
            .connect(),
    )
    .await
    .unwrap()
}

/// A raw `Cluster` client sending `token` (none for `None`).
async fn rpc(cluster: &LocalCluster, token: Option<&str>) -> Rpc {
    let bearer = token.map_or_else(Bearer::none, Bearer::new);
    ClusterClient::with_interceptor(channel(cluster).await, bearer)
}

/// A raw `WorkerLink` client sending `token`.
async fn link(cluster: &LocalCluster, token: Option<&str>) -> Link {
    let bearer = token.map_or_else(Bearer::none, Bearer::new);
    WorkerLinkClient::with_interceptor(channel(cluster).await, bearer)
}

/// The gRPC code of a call that must fail, and its message.
fn refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> (tonic::Code, String) {
    match result {
        Ok(reply) => panic!("the head accepted an attack: {reply:?}"),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

/// What an attack must leave exactly as it was.
/// The durable state a refused call must leave as it was: the cluster status without what the
/// workers' heartbeats refresh on their own (each node's fence report), and the tasks (without
/// their start times, which the workers' start reports set).
async fn snapshot(admin: &Client) -> (ClusterStatus, Vec<TaskSummary>) {
    let mut tasks = admin.list_tasks(None, None).await.unwrap();
    // A running task's start moves from its assignment's time to the worker's when the
    // worker's report of it lands, which may be after `running` saw the task assigned (seen
    // in CI under load): no refused call changes it.
    for task in &mut tasks {
        task.started_at_ms = None;
    }
    let mut status = status(admin).await;
    for node in &mut status.nodes {
        node.fence = None;
    }
    (status, tasks)
}

fn submit(argv: &[&str], env: &[(&str, &str)]) -> wire::SubmitRequest {
    let mut task = Task::command(argv.iter().copied());
    for (k, v) in env {
        task = task.env(*k, *v);
    }
    let spec = task.build().unwrap();
    wire::SubmitRequest {
        tasks: vec![spec.into()],
        namespace: String::new(),
        key: None,
    }
}

async fn app_token(admin: &Client, namespace: &str) -> String {
    let grant = Grant::new(Role::App, Some(namespace.parse().unwrap())).unwrap();
    admin.create_token(grant, namespace).await.unwrap().token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_valid_token_are_refused_on_every_service() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let before = snapshot(&admin).await;

    for token in [None, Some("escher-admin-0000"), Some("not a token at all")] {
        let mut c = rpc(&cluster, token).await;
        let (code, message) = refused(c.submit(submit(&["true"], &[])).await);
        assert_eq!(code, tonic::Code::Unauthenticated, "{token:?}: {message}");
        assert!(
            message.contains("token"),
            "the refusal says what is wrong: {message}"
        );
        let (code, _) = refused(
            c.cluster_status(wire::ClusterStatusRequest::default())
                .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated);
        let mut l = link(&cluster, token).await;
        let request = RegisterRequest {
            name: "intruder".into(),
            address: "127.0.0.1".into(),
            resources: "cpu=1000".parse().unwrap(),
            labels: Default::default(),
            running: vec![],
            gpus: vec![],
            finished: vec![],
            identity: None,
            boot_id: 1,
        };
        let (code, _) = refused(l.register(wire::RegisterRequest::from(request)).await);
        assert_eq!(code, tonic::Code::Unauthenticated);
        let bearer = token.map_or_else(Bearer::none, Bearer::new);
        let mut raft = RaftClient::with_interceptor(channel(&cluster).await, bearer);
        let status = wire::ReplicaStatusRequest {
            group: String::new(),
        };
        let (code, _) = refused(raft.status(status).await);
        assert_eq!(code, tonic::Code::Unauthenticated);
    }
    // A forged task credential.
    let mut c = rpc(&cluster, Some("escher-task-1-1-00ff")).await;
    let (code, _) = refused(
        c.cluster_status(wire::ClusterStatusRequest::default())
            .await,
    );
    assert_eq!(code, tonic::Code::Unauthenticated);

    // A revoked token stops working, and says so.
    let token = app_token(&admin, "team").await;
    let app = admin.clone().with_token(&token);
    app.cluster_status().await.unwrap();
    let id = admin
        .list_tokens()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.description == "team")
        .unwrap()
        .id;
    admin.revoke_token(&id).await.unwrap();
    match app.cluster_status().await.unwrap_err() {
        ClientError::Unauthenticated { message, .. } => {
            assert!(message.contains("revoked"), "{message}")
        }
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
    assert_eq!(snapshot(&admin).await, before);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_cannot_see_or_touch_each_other() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let node = cluster.nodes()[0];
    let admin = cluster.client().await.unwrap();
    // A shared resource an admin made, which both apps may request.
    admin
        .set_resource("shared/licence", 2, NodeSpec::Node(node))
        .await
        .unwrap();
    let (token_a, token_b) = (app_token(&admin, "a").await, app_token(&admin, "b").await);
    let a = admin.clone().with_token(&token_a);
    let b = admin.clone().with_token(&token_b);

    // Each runs a task that holds a secret in its environment and the shared licence.
    let run = |client: &Client, secret: &'static str| {
        let client = client.clone();
        async move {
            let task = Task::command(["sh", "-c", "echo $SECRET; sleep 30"])
                .env("SECRET", secret)
                .resources_str("shared/licence=1");
            client.submit(task).await.unwrap()
        }
    };
    let ta = run(&a, "secret-of-a").await;
    let tb = run(&b, "secret-of-b").await;
    running(&admin, &ta).await;
    running(&admin, &tb).await;
    // A's resource in its namespace.
    a.set_resource("mine", 1, NodeSpec::Node(node))
        .await
        .unwrap();
    let before = snapshot(&admin).await;

    // B cannot see, wait on, read, or cancel A's task: it is unknown to B.
    for result in [
        b.task_info(&ta).await.map(|_| ()),
        b.wait([ta.id()], 1, Some(Duration::ZERO)).await.map(|_| ()),
        // On the result stream, alone and beside B's own task.
        b.get(&ta, Some(Duration::from_secs(20))).await.map(|_| ()),
        {
            let wait = Some(Duration::from_millis(300));
            let (mine, theirs) = tokio::join!(b.get(&tb, wait), b.get(&ta, wait));
            // B's task runs on: its get times out, and is not refused with A's.
            assert!(matches!(mine, Err(ClientError::Timeout { .. })), "{mine:?}");
            theirs.map(|_| ())
        },
        b.logs(&ta, LogStream::Stdout).await.map(|_| ()),
        b.cancel([ta.id()]).await.map(|_| ()),
    ] {
        match result.unwrap_err() {
            ClientError::NotFound(message) => {
                assert!(message.contains("unknown task"), "{message}")
            }
            other => panic!("expected unknown task, got {other:?}"),
        }
    }
    let listed: Vec<_> = b
        .list_tasks(None, None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, [tb.id()], "B lists its own task only");
    // A namespace in the request does not reach another namespace.
    let mut raw_b = rpc(&cluster, Some(&token_b)).await;
    let mut request = submit(&["true"], &[]);
    request.namespace = "a".into();
    let (code, message) = refused(raw_b.submit(request).await);
    assert_eq!(code, tonic::Code::PermissionDenied, "{message}");
    // B cannot change A's resource, nor the shared one.
    for name in ["a/mine", "shared/licence"] {
        match b
            .delete_resource(name, NodeSpec::Node(node))
            .await
            .unwrap_err()
        {
            ClientError::PermissionDenied(message) => {
                assert!(message.contains("another namespace"), "{message}")
            }
            other => panic!("expected PermissionDenied for {name}, got {other:?}"),
        }
    }
    // B's status shows physical and shared resources and its own namespace, not A's.
    let seen = b.cluster_status().await.unwrap();
    let names: Vec<String> = seen.nodes[0]
        .resources
        .iter()
        .map(|r| r.name.to_string())
        .collect();
    assert!(names.iter().any(|n| n == "cpu"), "{names:?}");
    assert!(names.iter().any(|n| n == "shared/licence"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("a/")), "{names:?}");

    // Admin-only calls are refused to an app.
    let mut raw_a = rpc(&cluster, Some(&token_a)).await;
    let (code, _) = refused(
        raw_a
            .create_token(wire::CreateTokenRequest {
                role: wire::Role::Admin.into(),
                ..Default::default()
            })
            .await,
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    let (code, _) = refused(
        raw_a
            .drain(wire::DrainRequest {
                node: node.0,
                key: None,
            })
            .await,
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    let (code, _) = refused(
        raw_a
            .apply_mig_layout(wire::ApplyMigLayoutRequest {
                node: node.0,
                ..Default::default()
            })
            .await,
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert_eq!(snapshot(&admin).await, before, "nothing changed");

    // Each still sees and cancels its own.
    assert_eq!(a.cancel([ta.id()]).await.unwrap()[0].id, ta.id());
    b.cancel([tb.id()]).await.unwrap();
    let sa = finished(&admin, &ta).await;
    assert_eq!(sa.state, TaskState::Cancelled);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_resources_cannot_be_forged_through_any_path() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let node = cluster.nodes()[0];
    let admin = cluster.client().await.unwrap();
    let app = admin.clone().with_token(app_token(&admin, "x").await);
    let before = snapshot(&admin).await;
    for client in [&admin, &app] {
        for name in ["cpu", "gpu", "mig.1g.5gb", "memory"] {
            let err = client
                .set_resource(name, 64, NodeSpec::Node(node))
                .await
                .unwrap_err();
            assert!(err.is_refusal(), "{name}: {err:?}");
        }
        // A reservation whose name and bundle compose a physical name.
        let bundle: ResourceSet = "1g.5gb=1".parse().unwrap();
        let err = client
            .reserve(
                "mig",
                vec![bundle],
                GangStrategy::Pack,
                Some(Duration::from_secs(1)),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("physical"), "{err}");
    }
    assert_eq!(snapshot(&admin).await, before);
    cluster.shutdown().await;
}

/// Registers a worker of its own with the join token, as an attacker holding it would.
async fn register(link: &mut Link, name: &str) -> (NodeId, String) {
    let request = RegisterRequest {
        name: name.into(),
        address: "127.0.0.1".into(),
        resources: "cpu=1".parse().unwrap(),
        labels: Default::default(),
        running: vec![],
        gpus: vec![],
        finished: vec![],
        identity: None,
        boot_id: 7,
    };
    let reply = link
        .register(wire::RegisterRequest::from(request))
        .await
        .unwrap()
        .into_inner();
    let reply = escher::types::RegisterReply::try_from(reply).unwrap();
    (reply.node_id, reply.secret.unwrap())
}

/// A worker that registers (with the join token, and more CPUs than any other node) and never
/// attaches its stream is given no task: placement waits for the stream (`state/nodes.rs`), so
/// the tasks run on the attached worker and none waits for the silent node to be declared
/// lost (before, about a third of them went there and failed with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_registers_and_never_attaches_is_given_no_task() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let real = cluster.nodes()[0];
    let admin = cluster.client().await.unwrap();
    let access = cluster.access().clone();
    let mut joined = link(&cluster, Some(&access.worker_token)).await;
    let request = RegisterRequest {
        name: "silent".into(),
        address: "127.0.0.1".into(),
        resources: "cpu=1000".parse().unwrap(),
        labels: Default::default(),
        running: vec![],
        gpus: vec![],
        finished: vec![],
        identity: None,
        boot_id: 3,
    };
    let reply = joined
        .register(wire::RegisterRequest::from(request))
        .await
        .unwrap()
        .into_inner();
    let silent = escher::types::RegisterReply::try_from(reply)
        .unwrap()
        .node_id;
    let registered = status(&admin).await;
    assert!(
        registered.node(silent).is_some_and(|n| n.alive),
        "the silent worker registered: {registered:?}"
    );

    let tasks = (0..20).map(|i| {
        Task::command(["true"])
            .name(format!("t{i}"))
            .resources_str("cpu=1")
    });
    let handles = admin.submit_batch(tasks).await.unwrap();
    for handle in handles {
        let done = finished(&admin, handle.id()).await;
        assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
        assert_eq!(done.node, Some(real), "{done:?}");
        assert_eq!(
            done.attempt, 1,
            "ran once, where it was first placed: {done:?}"
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_bound_to_their_own_node_and_tasks() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let real = cluster.nodes()[0];
    let admin = cluster.client().await.unwrap();
    let app_tok = app_token(&admin, "w").await;
    let victim = admin
        .submit(Task::command(["sleep", "30"]).resources_str("cpu=1"))
        .await
        .unwrap();
    let victim_status = running(&admin, &victim).await;
    assert_eq!(victim_status.node, Some(real));

    // Only the join token (or an admin) registers workers.
    let mut as_app = link(&cluster, Some(&app_tok)).await;
    let request = RegisterRequest {
        name: "intruder".into(),
        address: "127.0.0.1".into(),
        resources: "cpu=1000".parse().unwrap(),
        labels: Default::default(),
        running: vec![],
        gpus: vec![],
        finished: vec![],
        identity: None,
        boot_id: 1,
    };
    let (code, _) = refused(as_app.register(wire::RegisterRequest::from(request)).await);
    assert_eq!(code, tonic::Code::PermissionDenied);

    // A worker with the join token gets a node of its own, and nothing more.
    let access = cluster.access().clone();
    let mut joined = link(&cluster, Some(&access.worker_token)).await;
    let (fake, secret) = register(&mut joined, "fake").await;
    assert_ne!(fake, real);
    // Attaching to the real node's id without its secret is refused.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let hello = WorkerMessage::Hello {
        node_id: real,
        secret: "guess".into(),
        interned_names: true,
    };
    tx.send(one(hello)).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let (code, _) = refused(joined.attach(stream).await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    // On its own stream, a report about the victim's task (which it does not run) is refused:
    // the task keeps running on its real node.
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(one(WorkerMessage::Hello {
        node_id: fake,
        secret,
        interned_names: false,
    }))
    .await
    .unwrap();
    let mut inbound = joined
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let forged = TaskFinished {
        task_id: victim.id(),
        attempt: victim_status.attempt,
        outcome: Ok(TaskResult::Exited { code: 0 }),
        timed_out: false,
        output: None,
    };
    tx.send(one(WorkerMessage::TaskFinished(forged)))
        .await
        .unwrap();
    let started = WorkerMessage::TaskStarted {
        task_id: victim.id(),
        attempt: victim_status.attempt + 1,
    };
    tx.send(one(started)).await.unwrap();
    // The head acknowledges the forged report (so a confused worker forgets it) but applies
    // nothing; read the stream until the acknowledgement comes.
    within("the acknowledgement of the refused report", async {
        while let Some(batch) = inbound.message().await.unwrap() {
            let acked = |m: &wire::HeadMessage| {
                matches!(m.body, Some(wire::head_message::Body::ReportsAcked(_)))
            };
            if batch.messages.iter().any(acked) {
                break;
            }
        }
    })
    .await;
    let after = admin.task_info(&victim).await.unwrap().status;
    assert_eq!(after.state, TaskState::Running, "{after:?}");
    assert_eq!(after.node, Some(real));
    assert_eq!(after.attempt, victim_status.attempt);
    admin.cancel([victim.id()]).await.unwrap();
    drop(tx);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reads_and_a_task_acts_in_its_own_namespace() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let grant = Grant::new(Role::Reader, None).unwrap();
    let reader = admin
        .clone()
        .with_token(admin.create_token(grant, "dashboard").await.unwrap().token);
    reader.cluster_status().await.unwrap();
    match reader.submit(Task::command(["true"])).await.unwrap_err() {
        ClientError::PermissionDenied(message) => {
            assert!(message.contains("reader"), "{message}")
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    // A task of namespace `t` marks its node with the CLI, using the credential its worker
    // gave it: the name lands in `t`, and Local means its own node.
    let app = admin.clone().with_token(app_token(&admin, "t").await);
    let bin = common::escher_bin();
    let task = app
        .submit(
            Task::command([
                "sh",
                "-c",
                r#""$ESCHER_BIN" resource set here unbounded --local"#,
            ])
            .env("ESCHER_BIN", bin.to_str().unwrap()),
        )
        .await
        .unwrap();
    let done = finished(&admin, &task).await;
    assert_eq!(done.state, TaskState::Succeeded, "{done:?}");
    let seen = status(&admin).await;
    let node = done.node.unwrap();
    assert!(
        common::resource(&seen, node, "t/here").is_some(),
        "the task's resource is in its namespace"
    );
    // A task's credential acts for it only while its attempt runs: kept after the task
    // ended, it is refused.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let script = format!(r#"printf %s "$ESCHER_TASK_TOKEN" > {}"#, file.display());
    let task = app
        .submit(Task::command(["sh", "-c", &script]))
        .await
        .unwrap();
    assert_eq!(finished(&admin, &task).await.state, TaskState::Succeeded);
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(kept.starts_with("escher-task-"), "{kept}");
    let mut raw = rpc(&cluster, Some(&kept)).await;
    let (code, message) = refused(raw.submit(submit(&["true"], &[])).await);
    assert_eq!(code, tonic::Code::Unauthenticated, "{message}");
    assert!(
        message.contains("only while that attempt runs"),
        "{message}"
    );
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_credential_is_refused_on_every_method_once_its_attempt_ends() {
    let cluster = within("starting", cluster().workers(1).start())
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let (task, kept, _dir) = common::task_with_its_credential(&admin).await;
    let mut raw = rpc(&cluster, Some(&kept)).await;
    // While its attempt runs, the credential reads what a status reader reads.
    raw.gpus(wire::GpusRequest {}).await.unwrap();
    raw.heads(wire::HeadsRequest {}).await.unwrap();
    raw.cluster_status(wire::ClusterStatusRequest::default())
        .await
        .unwrap();
    admin.cancel([task.id()]).await.unwrap();
    assert_eq!(finished(&admin, &task).await.state, TaskState::Cancelled);
    // Once it ended, every method refuses it, those that touch no task included.
    let ended = |(code, message): (tonic::Code, String)| {
        assert_eq!(code, tonic::Code::Unauthenticated, "{message}");
        assert!(
            message.contains("only while that attempt runs"),
            "{message}"
        );
    };
    ended(refused(raw.gpus(wire::GpusRequest {}).await));
    ended(refused(raw.heads(wire::HeadsRequest {}).await));
    ended(refused(
        raw.cluster_status(wire::ClusterStatusRequest::default())
            .await,
    ));
    ended(refused(raw.submit(submit(&["true"], &[])).await));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_small_requests_and_silent_connections_are_cut() {
    let config = HeadConfig {
        idle_timeout: Duration::from_secs(1),
        ..HeadConfig::default()
    };
    let cluster = within("starting", cluster().head_config(config).workers(1).start())
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let before = snapshot(&admin).await;
    // A status read carries a few bytes; 100 KB sent to ClusterStatus (as fields the empty
    // request message would skip) is refused, even from an admin, before it is decoded.
    let big = submit(&["echo", &"x".repeat(100_000)], &[]);
    let mut grpc = tonic::client::Grpc::new(InterceptedService::new(
        channel(&cluster).await,
        Bearer::new(cluster.admin_token()),
    ));
    within("ready", grpc.ready()).await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/escher.v1.Cluster/ClusterStatus");
    let codec = tonic_prost::ProstCodec::<wire::SubmitRequest, wire::ClusterStatusReply>::default();
    let answer = grpc.unary(tonic::Request::new(big), path, codec).await;
    let (code, message) = refused(answer);
    assert_eq!(code, tonic::Code::ResourceExhausted, "{message}");
    assert!(
        message.contains("ClusterStatus") && message.contains("65536"),
        "{message}"
    );
    // A raw connection that never speaks is closed after the idle timeout (1 s here); the
    // admin's client, pinged and answering, is not.
    let addr = cluster.head_url().trim_start_matches("http://").to_owned();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 256];
    let closed = within("the silent connection to close", async {
        loop {
            match tokio::io::AsyncReadExt::read(&mut silent, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    });
    closed.await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(snapshot(&admin).await, before, "nothing changed");
    cluster.shutdown().await;
}

/// Runs `bin` (a sibling of the `escher` CLI) with `args` in `home` (its `ESCHER_HOME`), and
/// returns whether it succeeded and what it printed.
fn run_in(home: &std::path::Path, bin: &str, args: &[&str]) -> (bool, String) {
    let path = common::escher_bin().with_file_name(bin);
    let out = std::process::Command::new(path)
        .args(args)
        .env("ESCHER_HOME", home)
        .env_remove("ESCHER_ACCESS_FILE")
        .env_remove("ESCHER_TOKEN")
        .env_remove("ESCHER_HEAD")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_tls_head_is_trusted_through_its_access_file_and_only_so() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let url_file = dir.path().join("url");
    let spawn = |bin: &str, args: &[&str]| {
        let path = common::escher_bin().with_file_name(bin);
        Child(
            std::process::Command::new(path)
                .args(args)
                .env("ESCHER_HOME", &home)
                .env_remove("ESCHER_ACCESS_FILE")
                .env_remove("ESCHER_TOKEN")
                .env_remove("ESCHER_HEAD")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let url_arg = url_file.to_str().unwrap();
    let _head = spawn(
        "escher-head",
        &[
            "--tls",
            "--listen",
            "127.0.0.1:0",
            "--address-file",
            url_arg,
        ],
    );
    let started = std::time::Instant::now();
    while !url_file.exists() {
        assert!(started.elapsed() < common::LIMIT, "the head did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = std::fs::read_to_string(&url_file).unwrap();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let access = escher::access::AccessFile::read(&home.join("access.json")).unwrap();
    assert!(access.ca_cert.is_some() && access.heads == [url.clone()]);

    // A worker and the CLI with no flag at all: the access file names the head, its
    // certificate and their tokens.
    let _worker = spawn(
        "escher-worker",
        &["--name", "w", "--resources", "cpu=1", "--no-nvml"],
    );
    let deadline = std::time::Instant::now() + common::LIMIT;
    loop {
        let (ok, out) = run_in(
            &home,
            "escher",
            &["submit", "--wait", "--", "echo", "over-tls"],
        );
        if ok {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Plain text to it, or TLS trusting another certificate, fails and says what to do.
    let plain = url.replace("https://", "http://");
    let (ok, out) = run_in(&home, "escher", &["--head", &plain, "status"]);
    assert!(!ok && out.contains("use https://"), "{out}");
    let other = dir.path().join("other.pem");
    let cert = rcgen_cert();
    std::fs::write(&other, cert).unwrap();
    let (ok, out) = run_in(
        &home,
        "escher",
        &["--ca", other.to_str().unwrap(), "status"],
    );
    assert!(!ok && out.contains("not one this client trusts"), "{out}");
}

/// A self-signed certificate of some other server.
fn rcgen_cert() -> String {
    let dir = tempfile::tempdir().unwrap();
    escher_head::runtime::TlsIdentity::generated(dir.path(), "127.0.0.2".parse().unwrap())
        .unwrap()
        .cert_pem
}

/// `msg` as a worker stream's batch of one.
fn one(msg: WorkerMessage) -> wire::WorkerBatch {
    wire::WorkerBatch {
        messages: vec![msg.into()],
    }
}
