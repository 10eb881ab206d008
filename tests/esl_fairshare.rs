//! End-to-end: hierarchical max-min fair sharing (the `fair_share` ESL) on a real cluster,
//! the thesis' Fig. 4.5c timeline at 10 nodes (the 100-node run belongs in the benchmarks).
//!
//! Sub-Org1 = users A and B with weights 2:3, Sub-Org2 = user C, the sub-orgs with equal
//! weights. Each active user keeps 12 `nap` tasks (300 ms, 1 cpu) outstanding, resubmitting
//! as they finish; a background rebalancer runs every 150 ms. The checks, each polled with a
//! generous deadline (no timing assertions):
//!
//! 1. A alone: A's resource is on all 10 nodes and A runs 10 tasks (±1);
//! 2. B arrives: the resources split exactly 4:6, running tasks converge to 4:6 (±1 each),
//!    and every running task of A or B runs on a node its user holds;
//! 3. C arrives: 2/3/5 exactly in resources (C's = A's + B's), running tasks 2/3/5 (±1).

use std::collections::BTreeMap;
use std::time::Duration;

use escher::esl::testing::within_for;
use escher::esl::{Domain, Hfs};
use escher::types::{ClusterStatus, ListTasksRequest, NodeId, TaskId, TaskSpec, TaskState};
use escher::{Client, Functions, LocalCluster, Task};
use tokio::sync::watch;

/// Bound on each phase's convergence (the cluster shares 2 cores with other test binaries).
const CONVERGE: Duration = Duration::from_secs(90);
/// How many tasks each active user keeps outstanding (more than the 10 nodes).
const OUTSTANDING: usize = 12;
/// How long each task runs.
const NAP_MS: u64 = 300;
/// Running-task tolerance per user, in nodes.
const TOLERANCE: usize = 1;

fn functions() -> Functions {
    Functions::new().typed_function("nap", |ctx, ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, String>(ctx.node_id().0)
    })
}

fn naps(user: &str, n: usize) -> Vec<TaskSpec> {
    (0..n)
        .map(|_| {
            Task::function_typed("nap", &NAP_MS)
                .name(user)
                .resources_str("cpu=1")
                .build()
                .expect("a valid task")
        })
        .collect()
}

/// Keeps `OUTSTANDING` tasks of `user` submitted through `hfs` until stopped; then cancels
/// what is left.
fn drive(hfs: Hfs<Client>, client: Client, user: &'static str) -> watch::Sender<bool> {
    let (stop, mut stopped) = watch::channel(false);
    tokio::spawn(async move {
        let mut out: Vec<TaskId> = Vec::new();
        loop {
            if *stopped.borrow() {
                break;
            }
            if out.len() < OUTSTANDING {
                match hfs.submit(user, naps(user, OUTSTANDING - out.len())).await {
                    Ok(ids) => out.extend(ids),
                    Err(e) => panic!("submitting {user}'s tasks: {e}"),
                }
            }
            tokio::select! {
                _ = stopped.changed() => break,
                r = client.wait(out.clone(), 1, Some(Duration::from_millis(200))) => {
                    let (_, not_ready) = r.expect("wait");
                    out = not_ready;
                }
            }
        }
        let _ = client.cancel(out).await;
    });
    stop
}

/// Per user: the nodes holding its resource, and where its tasks run now.
struct Sample {
    holders: BTreeMap<&'static str, Vec<NodeId>>,
    running: BTreeMap<&'static str, Vec<NodeId>>,
}

impl Sample {
    fn shares(&self) -> Vec<usize> {
        self.holders.values().map(Vec::len).collect()
    }

    fn counts(&self) -> Vec<usize> {
        self.running.values().map(Vec::len).collect()
    }

    /// Every running task of a user runs on a node the user holds.
    fn on_own_nodes(&self) -> bool {
        self.running
            .iter()
            .all(|(u, nodes)| nodes.iter().all(|n| self.holders[u].contains(n)))
    }
}

async fn sample(client: &Client, users: &[(&'static str, String)]) -> Sample {
    let status: ClusterStatus = client.cluster_status().await.expect("cluster_status");
    let running = client
        // One page is one consistent snapshot (a second page could count a task that started
        // after the first was read, next to the one it replaced).
        .list_tasks_page(ListTasksRequest {
            state: Some(TaskState::Running),
            limit: 1000,
            ..ListTasksRequest::default()
        })
        .await
        .map(|page| page.tasks)
        .expect("list_tasks");
    let mut s = Sample {
        holders: BTreeMap::new(),
        running: BTreeMap::new(),
    };
    for (user, resource) in users {
        let holders = status
            .nodes
            .iter()
            .filter(|n| n.alive)
            .filter(|n| n.resource(resource).is_some_and(|r| !r.total.is_zero()))
            .map(|n| n.id)
            .collect();
        s.holders.insert(user, holders);
        let on = running
            .iter()
            .filter(|t| t.name == *user)
            .filter_map(|t| t.node)
            .collect();
        s.running.insert(user, on);
    }
    s
}

/// Polls until `ok` holds for a sample; the sample.
async fn converge(
    client: &Client,
    users: &[(&'static str, String)],
    what: &str,
    ok: impl Fn(&Sample) -> bool,
) -> Sample {
    let poll = async {
        loop {
            let s = sample(client, users).await;
            if ok(&s) {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    match tokio::time::timeout(CONVERGE, poll).await {
        Ok(s) => s,
        Err(_) => {
            let s = sample(client, users).await;
            panic!(
                "{what}: no convergence within {CONVERGE:?}; last shares {:?}, running {:?}",
                s.shares(),
                s.counts()
            )
        }
    }
}

fn near(got: usize, want: usize) -> bool {
    got.abs_diff(want) <= TOLERANCE
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_shares_follow_the_thesis_timeline() {
    let mut builder = LocalCluster::builder().no_workers().functions(functions());
    for _ in 0..10 {
        builder = builder.worker("cpu=1".parse().expect("resources"));
    }
    let cluster = within_for(
        Duration::from_secs(60),
        "starting 10 workers",
        builder.start(),
    )
    .await
    .expect("the cluster starts");
    let client = cluster.client().await.expect("client");

    let top = Hfs::new(client.clone(), "top", Domain::All).expect("instance");
    within_for(CONVERGE, "users", async {
        top.create_user("org1", 1).await.expect("org1");
        top.create_user("org2", 1).await.expect("org2");
    })
    .await;
    let org1 = top.child_for("org1").expect("child");
    let org2 = top.child_for("org2").expect("child");
    let (a, b, c) = within_for(CONVERGE, "users", async {
        (
            org1.create_user("A", 2).await.expect("A"),
            org1.create_user("B", 3).await.expect("B"),
            org2.create_user("C", 1).await.expect("C"),
        )
    })
    .await;
    let users = [
        ("A", a.resource().to_string()),
        ("B", b.resource().to_string()),
        ("C", c.resource().to_string()),
    ];
    let rebalancer = top.spawn_rebalancer(Duration::from_millis(150));

    // 1. A alone takes every node.
    let stop_a = drive(org1.clone(), client.clone(), "A");
    let s = converge(&client, &users, "A alone", |s| {
        s.shares() == [10, 0, 0] && near(s.counts()[0], 10)
    })
    .await;
    eprintln!("A alone: shares {:?}, running {:?}", s.shares(), s.counts());

    // 2. B arrives: 2:3 within Sub-Org1.
    let stop_b = drive(org1.clone(), client.clone(), "B");
    let s = converge(&client, &users, "B arrives", |s| {
        let n = s.counts();
        s.shares() == [4, 6, 0] && near(n[0], 4) && near(n[1], 6) && s.on_own_nodes()
    })
    .await;
    eprintln!("A + B: shares {:?}, running {:?}", s.shares(), s.counts());

    // 3. C arrives: Sub-Org2 takes half, C = A + B.
    let stop_c = drive(org2.clone(), client.clone(), "C");
    let s = converge(&client, &users, "C arrives", |s| {
        let n = s.counts();
        s.shares() == [2, 3, 5]
            && near(n[0], 2)
            && near(n[1], 3)
            && near(n[2], 5)
            && s.on_own_nodes()
    })
    .await;
    eprintln!(
        "A + B + C: shares {:?}, running {:?}",
        s.shares(),
        s.counts()
    );
    let shares = s.shares();
    assert_eq!(
        shares[2],
        shares[0] + shares[1],
        "C's allocation equals A's plus B's"
    );

    for stop in [stop_a, stop_b, stop_c] {
        let _ = stop.send(true);
    }
    within_for(CONVERGE, "stopping the rebalancer", rebalancer.stop()).await;
    within_for(CONVERGE, "shutdown", cluster.shutdown()).await;
}
