//! The head's Prometheus endpoint (docs/DESIGN.md §11): a real head with `metrics` on a loopback
//! port and a real worker, a small scenario, then `/metrics` scraped over HTTP and parsed with a
//! Prometheus text parser; the gauges must match what `cluster_status` and the tasks say, and a
//! scrape without a token, or with a worker's, is refused.

mod common;

use std::net::SocketAddr;

use common::{cluster, free_addr, within};
use escher::types::{NodeSpec, TaskState};
use escher::{LocalCluster, Task};
use prometheus_parse::{Sample, Scrape, Value};

/// `GET /metrics` with `token` (if any): the status code and the body.
fn scrape(addr: SocketAddr, token: Option<&str>) -> (u16, String) {
    let mut request = ureq::get(format!("http://{addr}/metrics"))
        .config()
        .http_status_as_error(false)
        .build();
    if let Some(t) = token {
        request = request.header("Authorization", format!("Bearer {t}"));
    }
    let mut response = request.call().expect("the metrics endpoint answers");
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_string()
        .expect("a text body");
    (response.status().as_u16(), body)
}

/// The value of the one sample named `name` whose labels include `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
    match found[0].value {
        Value::Gauge(v) | Value::Counter(v) | Value::Untyped(v) => v,
        ref other => panic!("{name}: unexpected {other:?}"),
    }
}

fn parse(body: &str) -> Scrape {
    let lines = body.lines().map(|l| Ok(l.to_string()));
    Scrape::parse(lines).expect("the exposition text parses")
}

/// A cluster of one worker whose head serves `/metrics` at the returned address.
async fn with_metrics() -> (LocalCluster, SocketAddr) {
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        metrics: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within("starting", cluster().workers(1).head_config(config).start())
        .await
        .unwrap();
    (cluster, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_cluster_and_need_a_token() {
    let (cluster, addr) = with_metrics().await;
    let client = cluster.client().await.unwrap();
    let node = cluster.nodes()[0];
    client
        .set_resource("dataset-7", 3, NodeSpec::Node(node))
        .await
        .unwrap();
    let done = client
        .submit_batch((0..3).map(|_| Task::command(["true"])))
        .await
        .unwrap();
    let ids: Vec<_> = done.iter().map(|t| t.id()).collect();
    let (ready, _) = within("the tasks to finish", client.wait(ids, 3, None))
        .await
        .unwrap();
    assert!(
        ready.iter().all(|s| s.state == TaskState::Succeeded),
        "{ready:?}"
    );
    // One that no node can run.
    let pending = client
        .submit(Task::command(["true"]).resources_str("cpu=1000"))
        .await
        .unwrap();
    let info = client.task_info(pending.id()).await.unwrap();
    assert_eq!(info.status.state, TaskState::Pending);

    // A call answered with an error.
    let missing = client.task_info(escher::types::TaskId(999)).await;
    assert!(missing.is_err());

    let token = cluster.admin_token().to_string();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let scraped = parse(&body);
    let status = client.cluster_status().await.unwrap();
    assert_eq!(
        value(&scraped, "escher_tasks", &[("state", "succeeded")]),
        3.0
    );
    assert_eq!(
        value(&scraped, "escher_tasks", &[("state", "pending")]),
        1.0
    );
    assert_eq!(value(&scraped, "escher_nodes", &[("state", "alive")]), 1.0);
    let n = node.to_string();
    for r in &status.node(node).unwrap().resources {
        let name = r.name.as_str();
        let total: f64 = r.total.to_string().parse().unwrap_or(f64::INFINITY);
        let scraped_total = value(
            &scraped,
            "escher_resources",
            &[("name", name), ("node", &n), ("state", "total")],
        );
        assert_eq!(scraped_total, total, "{name}");
        let used: f64 = r.used.to_string().parse().unwrap();
        let scraped_used = value(
            &scraped,
            "escher_resources",
            &[("name", name), ("node", &n), ("state", "used")],
        );
        assert_eq!(scraped_used, used, "{name}");
    }
    assert_eq!(
        value(
            &scraped,
            "escher_resources",
            &[("name", "dataset-7"), ("node", &n), ("state", "available")]
        ),
        3.0
    );
    assert_eq!(value(&scraped, "escher_raft_leader", &[]), 1.0);
    // The worker reads its stream: nothing waits for it.
    assert_eq!(
        value(&scraped, "escher_worker_outbox", &[("node", &n)]),
        0.0
    );
    assert!(value(&scraped, "escher_raft_applied_index", &[]) > 0.0);
    // The client's submissions went on its submission stream.
    let streams = value(
        &scraped,
        "escher_grpc_requests_total",
        &[("method", "SubmitStream")],
    );
    assert_eq!(streams, 1.0);
    let errors = value(
        &scraped,
        "escher_grpc_errors_total",
        &[("method", "DescribeTask"), ("code", "NotFound")],
    );
    assert_eq!(errors, 1.0);
    let started = scraped
        .samples
        .iter()
        .find(|s| s.metric == "escher_submit_to_start_seconds")
        .expect("the submit-to-start histogram");
    match &started.value {
        Value::Histogram(buckets) => {
            let count = buckets.last().map_or(0.0, |b| b.count);
            assert!(count >= 3.0, "{buckets:?}");
        }
        other => panic!("not a histogram: {other:?}"),
    }
    // The scheduling-decision latency: every submission and every report was applied.
    for (command, at_least) in [("submit", 2.0), ("task_finished", 3.0)] {
        let applied = scraped
            .samples
            .iter()
            .find(|s| {
                s.metric == "escher_apply_seconds" && s.labels.get("command") == Some(command)
            })
            .unwrap_or_else(|| panic!("no escher_apply_seconds for {command}"));
        match &applied.value {
            Value::Histogram(buckets) => {
                let count = buckets.last().map_or(0.0, |b| b.count);
                assert!(count >= at_least, "{command}: {buckets:?}");
            }
            other => panic!("not a histogram: {other:?}"),
        }
    }

    // No token, or a worker's: refused, and said why.
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, None))
        .await
        .unwrap();
    assert_eq!(code, 401);
    assert!(body.contains("Authorization: Bearer"), "{body}");
    let worker_token = cluster.access().worker_token.clone();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&worker_token)))
        .await
        .unwrap();
    assert_eq!(code, 403, "{body}");
    cluster.shutdown().await;
}

#[test]
fn metrics_are_served_on_loopback_only() {
    let config = escher_head::HeadConfig {
        metrics: Some("0.0.0.0:9090".parse().unwrap()),
        ..escher_head::HeadConfig::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("only on a loopback address"), "{err}");
}

/// Every sample named `name` whose labels include `labels`.
fn samples<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_export_running_tasks_spawn_latency_and_gpu_slices() {
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        metrics: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster: LocalCluster = within(
        "starting",
        cluster()
            .no_workers()
            .worker_with_gpus(
                "cpu=4".parse().unwrap(),
                ["a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb"],
            )
            .head_config(config)
            .start(),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let node = cluster.nodes()[0].to_string();
    let done = client
        .submit_batch((0..3).map(|_| Task::command(["true"])))
        .await
        .unwrap();
    let ids: Vec<_> = done.iter().map(|t| t.id()).collect();
    within("the tasks to finish", client.wait(ids, 3, None))
        .await
        .unwrap();
    let holder = client
        .submit(Task::command(["sleep", "60"]).resources_str("mig.2g.10gb=1"))
        .await
        .unwrap();
    within("the holder to start", client.started(holder.id()))
        .await
        .unwrap();
    let gpus = client.gpus().await.unwrap();
    let slice = gpus[0].gpus[0]
        .info
        .slices
        .iter()
        .find(|s| s.profile == "2g.10gb")
        .unwrap()
        .clone();

    // The figures come with heartbeats: scrape until one has carried them all.
    let token = cluster.admin_token().to_string();
    let scraped = within("a heartbeat with the figures", async {
        loop {
            let token = token.clone();
            let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
                .await
                .unwrap();
            assert_eq!(code, 200, "{body}");
            let scraped = parse(&body);
            let running = samples(&scraped, "escher_worker_running_tasks", &[("node", &node)]);
            let spawned = samples(&scraped, "escher_worker_spawn_seconds", &[("node", &node)]);
            let spawned = match spawned.first().map(|s| &s.value) {
                Some(Value::Histogram(buckets)) => buckets.last().map_or(0.0, |b| b.count),
                _ => 0.0,
            };
            if running.len() == 1 && matches!(running[0].value, Value::Gauge(1.0)) && spawned >= 4.0
            {
                return scraped;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    // The slice the holder has is in use, its whole memory; the others are idle.
    let used = value(
        &scraped,
        "escher_gpu_slice_memory_used_bytes",
        &[("node", &node), ("gpu", "0"), ("slice", &slice.uuid)],
    );
    assert_eq!(used, slice.memory_mib as f64 * 1024.0 * 1024.0);
    let slices = samples(
        &scraped,
        "escher_gpu_slice_memory_used_bytes",
        &[("node", &node)],
    );
    assert_eq!(slices.len(), 4, "{slices:?}");
    let busy = value(
        &scraped,
        "escher_gpu_slice_utilization_percent",
        &[("node", &node), ("slice", &slice.uuid)],
    );
    assert_eq!(busy, 100.0);
    let gpu_memory = value(
        &scraped,
        "escher_gpu_memory_used_bytes",
        &[("node", &node), ("gpu", "0")],
    );
    assert_eq!(gpu_memory, used);
    // Its disks have room, and it says how much.
    let free = value(
        &scraped,
        "escher_worker_disk_free_bytes",
        &[("node", &node)],
    );
    assert!(free > 0.0, "{free}");
    let under = value(
        &scraped,
        "escher_worker_disk_under_reserve",
        &[("node", &node)],
    );
    assert_eq!(under, 0.0);
    client.cancel([holder.id()]).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submits_and_gets_that_queue_up_share_their_streams() {
    let (cluster, addr) = with_metrics().await;
    let client = cluster.client().await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..500 {
        let client = client.clone();
        set.spawn(async move {
            let task = Task::function("noop", Vec::new()).resources_str("cpu=0.01");
            client.submit(task).await.unwrap().id()
        });
    }
    let mut ids = Vec::new();
    while let Some(id) = within("submits", set.join_next()).await {
        ids.push(id.unwrap());
    }
    // Their ends come back on the result stream, one `get` each.
    let mut gets = tokio::task::JoinSet::new();
    for id in ids.clone() {
        let client = client.clone();
        gets.spawn(async move { client.get(id, None).await.unwrap() });
    }
    while let Some(status) = within("the tasks", gets.join_next()).await {
        assert_eq!(status.unwrap().state, TaskState::Succeeded);
    }
    let token = cluster.admin_token().to_string();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let scraped = parse(&body);
    for stream in ["SubmitStream", "WaitStream"] {
        let method = [("method", stream)];
        let opened = samples(&scraped, "escher_grpc_requests_total", &method);
        assert_eq!(opened.len(), 1, "{stream} was opened: {body}");
        let refused = samples(&scraped, "escher_grpc_errors_total", &method);
        assert!(refused.is_empty(), "{stream}: {refused:?}");
    }
    let calls = samples(
        &scraped,
        "escher_grpc_requests_total",
        &[("method", "Wait")],
    );
    assert!(calls.is_empty(), "no Wait call: {calls:?}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_updates_that_queue_up_share_calls_and_fail_alone() {
    let (cluster, addr) = with_metrics().await;
    let client = cluster.client().await.unwrap();
    let node = cluster.nodes()[0];
    let calls = |scraped: &Scrape| {
        samples(
            scraped,
            "escher_grpc_requests_total",
            &[("method", "SetResources")],
        )
        .iter()
        .map(|s| match s.value {
            Value::Counter(v) | Value::Untyped(v) => v,
            ref other => panic!("unexpected {other:?}"),
        })
        .sum::<f64>()
    };
    let token = cluster.admin_token().to_string();
    let scraped = move || {
        let token = token.clone();
        async move {
            let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
                .await
                .unwrap();
            assert_eq!(code, 200);
            parse(&body)
        }
    };
    let before = calls(&scraped().await);
    let cpu_before = client.cluster_status().await.unwrap().nodes[0]
        .resource("cpu")
        .unwrap()
        .total;

    // 300 resources created at once from as many futures: far fewer calls than updates.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300 {
        let client = client.clone();
        set.spawn(async move {
            let name = format!("queued-{i}");
            (
                i,
                client
                    .set_resource(name.as_str(), 2, NodeSpec::Node(node))
                    .await,
            )
        });
    }
    while let Some(joined) = within("updates", set.join_next()).await {
        let (i, outcome) = joined.unwrap();
        assert_eq!(outcome.unwrap(), [node], "update {i}");
    }
    let used = calls(&scraped().await) - before;
    assert!(
        (1.0..100.0).contains(&used),
        "{used} SetResources calls for 300 updates"
    );

    // Then 30 more, one of them a physical name, which the head refuses (and with it any call
    // that carries it): only that caller fails.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..30 {
        let client = client.clone();
        set.spawn(async move {
            let name = if i == 15 {
                "cpu".to_string()
            } else {
                format!("more-{i}")
            };
            (
                i,
                client
                    .set_resource(name.as_str(), 2, NodeSpec::Node(node))
                    .await,
            )
        });
    }
    while let Some(joined) = within("updates", set.join_next()).await {
        let (i, outcome) = joined.unwrap();
        if i == 15 {
            let err = outcome.unwrap_err();
            assert!(err.is_refusal(), "{err:?}");
            assert!(err.to_string().contains("cpu"), "{err}");
        } else {
            assert_eq!(outcome.unwrap(), [node], "update {i}");
        }
    }
    let status = client.cluster_status().await.unwrap();
    let made = |prefix: &str| {
        status.nodes[0]
            .resources
            .iter()
            .filter(|r| r.name.as_str().starts_with(prefix))
            .count()
    };
    assert_eq!((made("queued-"), made("more-")), (300, 29));
    let cpu = status.nodes[0].resource("cpu").unwrap();
    assert_eq!(cpu.total, cpu_before, "the physical resource is untouched");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_credential_reads_metrics_only_while_its_attempt_runs() {
    let (cluster, addr) = with_metrics().await;
    let admin = cluster.client().await.unwrap();
    let (task, kept, _dir) = common::task_with_its_credential(&admin).await;
    let (code, body) = scrape(addr, Some(&kept));
    assert_eq!(code, 200, "{body}");
    admin.cancel([task.id()]).await.unwrap();
    assert_eq!(
        common::finished(&admin, &task).await.state,
        TaskState::Cancelled
    );
    let (code, body) = scrape(addr, Some(&kept));
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("only while that attempt runs"), "{body}");
    cluster.shutdown().await;
}

/// The metrics show every namespace: an application's token is refused (it reads its own
/// through the API), a reader's is enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_for_readers_and_admins_not_applications() {
    use escher::types::{Grant, Role};
    let (cluster, addr) = with_metrics().await;
    let admin = cluster.client().await.unwrap();
    let app = Grant::new(Role::App, Some("team".parse().unwrap())).unwrap();
    let app = admin.create_token(app, "team").await.unwrap().token;
    let (code, body) = scrape(addr, Some(&app));
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("they show every namespace"), "{body}");
    let reader = Grant::new(Role::Reader, None).unwrap();
    let reader = admin.create_token(reader, "dash").await.unwrap().token;
    let (code, body) = scrape(addr, Some(&reader));
    assert_eq!(code, 200, "{body}");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_are_counted_by_state() {
    struct Idle;
    let class = escher::ActorClass::new("Idle", |_ctx, (): ()| async move { Ok(Idle) })
        .method("ping", |_i: &mut Idle, (): ()| Ok(()))
        .method("nap", |_i: &mut Idle, ms: u64| {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        });
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        metrics: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within(
        "starting",
        cluster()
            .functions(common::functions().actor(class))
            .workers(1)
            .head_config(config)
            .start(),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let alive = client
        .actor(Task::actor_typed("Idle", &()).resources_str("cpu=1"))
        .await
        .unwrap();
    let ended = client
        .actor(Task::actor_typed("Idle", &()).resources_str("cpu=1"))
        .await
        .unwrap();
    within("a call", alive.call::<(), ()>("ping", &()))
        .await
        .unwrap();
    within("a call", ended.call::<(), ()>("ping", &()))
        .await
        .unwrap();
    within("kill", ended.kill(true)).await.unwrap();

    let token = cluster.admin_token().to_string();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let scraped = parse(&body);
    assert_eq!(
        value(&scraped, "escher_actors", &[("state", "running")]),
        1.0
    );
    assert_eq!(
        value(&scraped, "escher_actors", &[("state", "cancelled")]),
        1.0
    );
    // Actors are tasks too.
    assert_eq!(
        value(&scraped, "escher_tasks", &[("state", "running")]),
        1.0
    );

    // The calls waiting at the live actors, as the worker's heartbeats say: four naps of a
    // second, one at a time, keep some waiting for seconds; then none.
    let naps: Vec<_> = (0..4)
        .map(|_| {
            let alive = alive.clone();
            tokio::spawn(async move { alive.call::<u64, ()>("nap", &1_000).await })
        })
        .collect();
    let token = cluster.admin_token().to_string();
    let pending_calls = move || {
        let token = token.clone();
        async move {
            let (_, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
                .await
                .unwrap();
            let scraped = parse(&body);
            let found = scraped
                .samples
                .iter()
                .any(|s| s.metric == "escher_actor_pending_calls");
            found.then(|| value(&scraped, "escher_actor_pending_calls", &[("namespace", "")]))
        }
    };
    let busy = common::eventually("calls waiting on /metrics", || {
        let probe = pending_calls.clone();
        async move { probe().await.filter(|n| *n >= 2.0) }
    })
    .await;
    assert!(busy <= 4.0, "{busy} calls waiting, of four");
    for nap in naps {
        within("a nap", nap).await.unwrap().unwrap();
    }
    common::eventually("no call waiting on /metrics", || {
        let probe = pending_calls.clone();
        async move { probe().await.filter(|n| *n == 0.0) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_counted_with_their_bytes() {
    let (cluster, addr) = with_metrics().await;
    let client = cluster.client().await.unwrap();
    let kept = within("a put", client.put(vec![1u8; 1000])).await.unwrap();
    let _other = within("a put", client.put(vec![2u8; 24])).await.unwrap();
    let token = cluster.admin_token().to_string();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let scraped = parse(&body);
    assert_eq!(value(&scraped, "escher_objects", &[("state", "live")]), 2.0);
    assert_eq!(
        value(&scraped, "escher_object_bytes", &[("state", "live")]),
        1024.0
    );
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policys_report_reaches_metrics_and_status_and_only_its_namespace_sees_it() {
    use escher::esl::FairTime;
    use escher::esl::fair_time::{FairTimeConfig, HalfLife, Namespace, OnPreempt};

    let (cluster, addr) = with_metrics().await;
    let admin = cluster.client().await.unwrap();
    let app = |ns: &str| {
        let admin = admin.clone();
        let ns = ns.to_string();
        async move {
            let grant =
                escher::types::Grant::new(escher::types::Role::App, Some(ns.parse().unwrap()))
                    .unwrap();
            let token = admin.create_token(grant, "policy test").await.unwrap();
            admin.with_token(token.token)
        }
    };
    let ops = app("ops").await;
    let config = FairTimeConfig::new(HalfLife::from_secs(3600.0).unwrap())
        .namespace(Namespace::new("heavy"))
        .unwrap()
        .namespace(Namespace::new("light"))
        .unwrap();
    let policy = FairTime::new(ops.clone(), config).await.unwrap();
    let now = 1_800_000_000_000;
    policy.record_usage("heavy", 7200.0, now).unwrap();
    let spec = Task::command(["sleep", "30"])
        .resources_str("cpu=1")
        .build()
        .unwrap();
    policy
        .submit("light", spec, None, OnPreempt::Requeue)
        .unwrap();
    policy.round(now).await.unwrap();
    policy.publish(now).await.unwrap();

    // The reporting namespace and an admin see it; another namespace does not.
    let seen = ops.policies().await.unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let report = &seen[0];
    assert_eq!(report.policy, "fair-time");
    assert_eq!(report.namespace.as_deref(), Some("ops"));
    let row = |name: &str| report.rows.iter().find(|r| r.row == name).unwrap();
    assert_eq!(row("heavy").measures["usage"], 7200.0);
    assert!(row("heavy").measures["factor"] < row("light").measures["factor"]);
    assert_eq!(row("light").measures["running"], 1.0);
    assert_eq!(row("light").measures["holds.cpu"], 1.0);
    assert_eq!(admin.policies().await.unwrap(), seen);
    assert!(app("other").await.policies().await.unwrap().is_empty());

    // A report out of bounds is refused with what is wrong, and the kept one stays.
    let bad = vec![escher::types::PolicyRow {
        row: "a row".into(),
        measures: Default::default(),
    }];
    let err = ops.report_policy("fair-time", &bad).await.unwrap_err();
    assert!(err.to_string().contains("row \"a row\""), "{err}");
    assert_eq!(ops.policies().await.unwrap(), seen);

    let token = cluster.admin_token().to_string();
    let (code, body) = tokio::task::spawn_blocking(move || scrape(addr, Some(&token)))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let scraped = parse(&body);
    let labels = |row, measure| {
        [
            ("policy", "fair-time"),
            ("namespace", "ops"),
            ("row", row),
            ("measure", measure),
        ]
    };
    assert_eq!(
        value(&scraped, "escher_policy_measure", &labels("heavy", "usage")),
        7200.0
    );
    assert_eq!(
        value(
            &scraped,
            "escher_policy_measure",
            &labels("light", "running")
        ),
        1.0
    );
}
