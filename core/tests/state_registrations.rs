//! A node's removal names the registration its leader judged (`RemoveJudgedNode`,
//! `core/src/state/registrations.rs`): applied after the node registered again it changes
//! nothing; applied to the registration it judged it removes the node as `RemoveNode` does.

mod state_support;

use escher_core::state::{ApplyError, Command, Entry, Reply};
use escher_proto::types::{NodeId, TaskState};
use state_support::{TestState, register_command, task};

fn judged(node: NodeId, registration: Option<u64>) -> Command {
    Command::RemoveJudgedNode {
        node,
        registration,
        reason: "no heartbeat for 2s".to_string(),
    }
}

#[test]
fn a_removal_judged_before_the_same_worker_registered_again_changes_nothing() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let n2 = t.node("w2", "cpu=1");
    let (a, fx) = t.submit(task("cpu=1").retries(3));
    assert_eq!(fx, ["assign 1->1 #1"]);
    // The leader judges node 1 lost on the registration it has now.
    let first = t.state.registration(n1);
    assert!(first.is_some(), "a registration applied now is numbered");
    // Before the removal applies, the same worker process registers again (its stream broke,
    // a new leader took over): it still runs attempt 1.
    let (_, fx) = t.rejoin(n1, "w1", 1, &[(a, 1)], Vec::new()).unwrap();
    assert_eq!(fx, ["rejoined 1"], "nothing to send again");
    let second = t.state.registration(n1);
    assert!(second > first, "{second:?} after {first:?}");

    // The removal applies now: it was judged on the earlier registration.
    let out = t.apply(judged(n1, first));
    assert_eq!(out.reply, Reply::Done);
    assert!(out.fx().is_empty(), "{:?}", out.fx());
    assert!(t.state.node_alive(n1));
    assert_eq!(t.task_state(a), TaskState::Running);
    assert_eq!((t.status(a).node, t.status(a).attempt), (Some(n1), 1));

    // A removal judged on the registration it meets removes it, as `RemoveNode` does.
    let fx = t.apply(judged(n1, second)).fx();
    assert_eq!(fx, ["assign 1->2 #2"]);
    assert!(!t.state.node_alive(n1));
    assert_eq!(t.status(a).node, Some(n2));
    // Applied again it changes nothing; an unknown node is refused.
    assert!(t.apply(judged(n1, second)).fx().is_empty());
    let err = t.try_apply(judged(NodeId(99), None)).unwrap_err();
    assert_eq!(err, ApplyError::UnknownNode(NodeId(99)));
}

#[test]
fn a_removal_judged_before_a_restarted_worker_registered_again_leaves_the_new_registration() {
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(3));
    let first = t.state.registration(n1);
    // The worker restarted (another boot): its registration fails what the node ran, and the
    // task runs again there.
    let (_, fx) = t.rejoin(n1, "w1", 2, &[], Vec::new()).unwrap();
    assert_eq!(fx, ["rejoined 1", "assign 1->1 #2"]);
    let out = t.apply(judged(n1, first));
    assert!(out.fx().is_empty(), "{:?}", out.fx());
    assert!(t.state.node_alive(n1));
    assert_eq!(
        (t.task_state(a), t.status(a).attempt),
        (TaskState::Running, 2)
    );
}

#[test]
fn the_plain_removal_of_older_logs_still_removes_whatever_registration_it_meets() {
    // What `RemoveNode` (data formats before 9) does, and what this fix changes: the same
    // order of entries fails the live registration's attempt and runs it again.
    let mut t = TestState::new();
    let n1 = t.node("w1", "cpu=1");
    let _n2 = t.node("w2", "cpu=1");
    let (a, _) = t.submit(task("cpu=1").retries(3));
    t.rejoin(n1, "w1", 1, &[(a, 1)], Vec::new()).unwrap();
    assert_eq!(t.remove_node(n1), ["assign 1->2 #2"]);
    assert!(!t.state.node_alive(n1));
}

#[test]
fn registrations_of_entries_that_number_none_have_no_number_and_a_removal_judged_on_none_stands() {
    // A state that replays entries of a format before 9 numbers none of their registrations,
    // as a replica that loaded a snapshot of such a format has none: both agree.
    let mut t = TestState::new();
    let out = t
        .state
        .apply_entry(Entry::new(t.now, register_command("w1", "cpu=1")), false)
        .unwrap();
    let Reply::Registered(n1) = out else {
        panic!("{out:?}")
    };
    assert_eq!(t.state.registration(n1), None);
    // A numbered registration, then an unnumbered one: the number is gone again.
    t.rejoin(n1, "w1", 1, &[], Vec::new()).unwrap();
    assert!(t.state.registration(n1).is_some());
    let back = escher_core::state::Returning {
        cluster: state_support::CLUSTER.to_string(),
        node: n1,
        secret: state_support::secret("w1"),
        running: Vec::new(),
        finished: Vec::new(),
    };
    let rejoin = Command::RejoinNode {
        worker: state_support::joining("w1", "cpu=1", 1),
        back,
    };
    t.state
        .apply_entry(Entry::new(t.now, rejoin), false)
        .unwrap();
    assert_eq!(t.state.registration(n1), None);
    t.apply(judged(n1, None));
    assert!(!t.state.node_alive(n1));
}
