//! Node labels at run time (`Command::LabelNode`, `state/nodes.rs`): set and removed on a live
//! node all or none, kept across the worker's return, applied once under a retried key (a stale
//! retry never overwrites a newer label), and a walltime's drain.

mod state_support;

use escher_core::state::{ApplyError, Command, Entry, Reply, Returning};
use escher_proto::types::{
    DRAIN_AT_LABEL, ENDS_AT_LABEL, Labels, MAX_LABELS, NodeChange, NodeId, RequestKey,
};
use state_support::{CLUSTER, T0, TestState, joining, secret, task};

fn labels(text: &str) -> Labels {
    text.parse().unwrap()
}

fn label(
    t: &mut TestState,
    node: NodeId,
    set: &str,
    remove: &[&str],
) -> Result<Labels, ApplyError> {
    let out = t.try_apply(Command::LabelNode {
        node,
        set: labels(set),
        remove: remove.iter().map(|k| k.to_string()).collect(),
        drain: false,
    })?;
    match out.reply {
        Reply::Labels(labels) => Ok(labels),
        other => panic!("LabelNode replied {other:?}"),
    }
}

fn node_labels(t: &TestState, node: NodeId) -> String {
    t.state.node(node).unwrap().labels.to_string()
}

#[test]
fn labels_are_set_and_removed_on_a_live_node_and_the_core_sees_them() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=2");
    let out = t.apply(Command::LabelNode {
        node: n,
        set: labels("maintenance=true,zone=b"),
        remove: vec![],
        drain: false,
    });
    assert_eq!(out.reply, Reply::Labels(labels("maintenance=true,zone=b")));
    assert_eq!(out.events.len(), 1, "one node event: {:?}", out.events);
    assert!(
        format!("{:?}", out.events).contains(&format!("{:?}", NodeChange::Labelled)),
        "{:?}",
        out.events
    );
    assert_eq!(
        t.state.core().node(n).unwrap().labels.to_string(),
        "maintenance=true,zone=b"
    );

    // A removal of a key that is not there is no error; a change that changes nothing records
    // no event.
    assert_eq!(
        label(&mut t, n, "zone=c", &["maintenance", "absent"]).unwrap(),
        labels("zone=c")
    );
    let same = t.apply(Command::LabelNode {
        node: n,
        set: labels("zone=c"),
        remove: vec![],
        drain: false,
    });
    assert!(same.events.is_empty(), "{:?}", same.events);
    assert_eq!(node_labels(&t, n), "zone=c");
}

#[test]
fn an_unknown_or_lost_node_or_too_many_labels_is_refused_and_changes_nothing() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=2");
    assert!(matches!(
        label(&mut t, NodeId(99), "a=1", &[]),
        Err(ApplyError::UnknownNode(NodeId(99)))
    ));
    let many: Vec<String> = (0..MAX_LABELS).map(|i| format!("k{i}=v")).collect();
    label(&mut t, n, &many[..MAX_LABELS - 1].join(","), &[]).unwrap();
    let err = label(&mut t, n, "one=more,and=another", &[]).unwrap_err();
    assert!(err.to_string().contains("at most 256"), "{err}");
    t.remove_node(n);
    let err = label(&mut t, n, "a=1", &[]).unwrap_err();
    assert!(matches!(err, ApplyError::NodeNotLive(_)), "{err}");
    assert!(err.is_precondition());
}

#[test]
fn labels_set_at_run_time_outlive_the_workers_return_and_escher_labels_come_from_the_worker() {
    let mut t = TestState::new();
    let mut first = joining("w1", "cpu=2", 1);
    first.labels = labels("escher.limits=cpu,rack=r1,zone=a");
    let Reply::Registered(n) = t
        .apply(Command::RegisterNode {
            worker: first,
            secret: secret("w1"),
        })
        .reply
    else {
        panic!("not registered");
    };
    label(&mut t, n, "maintenance=true", &[]).unwrap();

    // The worker restarts with another zone and without the limits label.
    let mut again = joining("w1", "cpu=2", 2);
    again.labels = labels("zone=b");
    let back = Returning {
        cluster: CLUSTER.to_string(),
        node: n,
        secret: secret("w1"),
        running: vec![],
        finished: vec![],
    };
    t.apply(Command::RejoinNode {
        worker: again,
        back,
    });
    assert_eq!(
        node_labels(&t, n),
        "maintenance=true,rack=r1,zone=b",
        "the run-time label stays, the worker's zone wins, escher's own label is the worker's"
    );
    assert_eq!(
        t.state.core().node(n).unwrap().labels.to_string(),
        "maintenance=true,rack=r1,zone=b"
    );
}

#[test]
fn a_stale_retry_of_an_earlier_label_write_never_overwrites_a_newer_one() {
    let mut t = TestState::new();
    let n = t.node("w1", "cpu=2");
    let write = |value: &str| Command::LabelNode {
        node: n,
        set: labels(&format!("state={value}")),
        remove: vec![],
        drain: false,
    };
    let first_key = RequestKey {
        client: 7,
        seq: 1,
        first_incomplete: 1,
    };
    let keyed = |command, key, now| Entry {
        now,
        command,
        key: Some(key),
    };
    // Client 7 writes `old`; its reply is lost. Client 8 writes `new`. Then client 7's retry of
    // the same write arrives (a leader change in between, say).
    let first = t.state.apply(keyed(write("old"), first_key, T0)).unwrap();
    let second_key = RequestKey {
        client: 8,
        seq: 1,
        first_incomplete: 1,
    };
    t.state
        .apply(keyed(write("new"), second_key, T0 + 1))
        .unwrap();
    let retry = t
        .state
        .apply(keyed(write("old"), first_key, T0 + 2))
        .unwrap();
    assert_eq!(
        retry, first,
        "the retry gets the reply of the first application"
    );
    assert_eq!(node_labels(&t, n), "state=new", "and changes nothing");
}

#[test]
fn a_walltime_drains_its_node_once_its_drain_time_comes() {
    let mut t = TestState::new();
    let mut worker = joining("w1", "cpu=2", 1);
    let drain_at = T0 + 60_000;
    worker.labels = labels(&format!(
        "{ENDS_AT_LABEL}={},{DRAIN_AT_LABEL}={drain_at}",
        drain_at + 300_000
    ));
    let Reply::Registered(n) = t
        .apply(Command::RegisterNode {
            worker,
            secret: secret("w1"),
        })
        .reply
    else {
        panic!("not registered");
    };
    let other = t.node("w2", "cpu=2");
    assert_eq!(t.state.next_walltime_drain(), Some(drain_at));
    assert!(t.state.nodes_ending(drain_at - 1).is_empty());
    assert_eq!(t.state.nodes_ending(drain_at), vec![n]);

    // The owner's command at that time: labelled, drained, given nothing new.
    t.advance(60_000);
    let out = t.apply(Command::LabelNode {
        node: n,
        set: labels("escher.ending-soon=true"),
        remove: vec![],
        drain: true,
    });
    assert!(matches!(out.reply, Reply::Labels(_)));
    assert!(t.state.node(n).unwrap().draining);
    assert!(t.state.nodes_ending(drain_at).is_empty(), "drained once");
    assert_eq!(t.state.next_walltime_drain(), None);
    let (_, fx) = t.submit(task("cpu=1"));
    assert!(
        fx.iter().all(|e| e.contains(&other.to_string())),
        "new work goes to the other node: {fx:?}"
    );
}

#[test]
fn a_task_with_a_time_limit_is_placed_only_on_a_node_that_lasts_it_and_says_why_it_waits() {
    let mut t = TestState::new();
    // A node whose walltime ends in ten minutes.
    let mut worker = joining("w1", "cpu=2", 1);
    let ends_at = T0 + 600_000;
    worker.labels = labels(&format!("{ENDS_AT_LABEL}={ends_at}"));
    let Reply::Registered(short) = t
        .apply(Command::RegisterNode {
            worker,
            secret: secret("w1"),
        })
        .reply
    else {
        panic!("not registered");
    };
    // An hour-long task waits, and says why; a five-minute one runs there.
    let (long, fx) = t.submit(task("cpu=1").timeout(std::time::Duration::from_secs(3600)));
    assert!(fx.is_empty(), "{fx:?}");
    let why = t.state.task_info(long).unwrap().pending_reason.unwrap();
    assert_eq!(
        why.resource.as_str(),
        escher_core::scheduler::WALLTIME_REASON
    );
    assert!(
        why.message
            .contains("time limit (3600 s) outlasts every live node"),
        "{why}"
    );
    let (_, fx) = t.submit(task("cpu=1").timeout(std::time::Duration::from_secs(300)));
    assert!(
        fx.iter().any(|e| e.contains(&short.to_string())),
        "the short task runs on the short node: {fx:?}"
    );

    // A head restored from a snapshot knows the limit and the reason again.
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(&t.state, config).unwrap();
    let (restored, _): (escher_core::state::ClusterState, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    t.state = restored.restore(Default::default());
    // A node that lasts joins: the long task runs there, and nowhere else.
    let lasting = t.node("w2", "cpu=2");
    assert_eq!(t.state.core().running_on(long), Some(lasting));
    assert!(t.state.task_info(long).unwrap().pending_reason.is_none());
}
