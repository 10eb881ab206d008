//! Scenario tests of the core's interned resource names: a name lives exactly as long as a
//! node holds it or a known task requests it, freed ids are reused, and a reused id never
//! stands for the name it had before. The sanity check after every step recounts every
//! reference.

mod support;

use escher_proto::types::NodeId;
use support::{TestEnv, dispatches};

#[test]
fn a_name_lives_while_a_node_holds_it() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    assert_eq!(env.core.name_count(), 1);
    env.set(1, "x", "2");
    assert_eq!(env.core.name_count(), 2);
    env.delete(1, "x");
    assert_eq!(env.core.name_count(), 1, "x is gone once no node holds it");
    env.remove_node(1);
    assert_eq!(env.core.name_count(), 0, "a node's names leave with it");
}

#[test]
fn a_name_no_node_ends_up_holding_is_not_kept() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    env.delete(1, "never-there");
    env.set(1, "zero", "0");
    assert_eq!(env.core.name_count(), 1);
}

#[test]
fn a_pending_task_keeps_the_names_it_requests() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    let out = env.submit(1, "cpu=1,lock=1");
    assert!(out[0].starts_with("infeasible 1"), "{out:?}");
    assert_eq!(env.core.name_count(), 2, "lock is requested, so it is kept");
    env.cancel(1);
    assert_eq!(env.core.name_count(), 1);
}

#[test]
fn a_running_task_keeps_a_deleted_resource_until_it_releases_it() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    env.set(1, "x", "1");
    assert_eq!(env.submit(1, "x=1"), dispatches(&[(1, 1)]));
    env.delete(1, "x");
    assert_eq!(env.slot(1, "x"), Some(("0".into(), "1".into())));
    assert_eq!(env.core.name_count(), 2);
    env.finish(1);
    assert_eq!(env.slot(1, "x"), None);
    assert_eq!(env.core.name_count(), 1);
}

#[test]
fn a_reused_id_never_stands_for_the_old_name() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=4");
    env.set(1, "old", "1");
    env.delete(1, "old"); // frees old's id
    env.set(1, "new", "1"); // takes it
    let out = env.submit(1, "old=1");
    assert!(
        out[0].starts_with("infeasible 1: resource old"),
        "a task for the freed name must not run on the name that took its id: {out:?}"
    );
    assert_eq!(env.submit(2, "new=1"), dispatches(&[(2, 1)]));
    assert_eq!(env.set(1, "old", "1"), ["feasible 1", "dispatch 1->1"]);
    assert_eq!(env.slot(1, "old"), Some(("1".into(), "1".into())));
    assert_eq!(env.slot(1, "new"), Some(("1".into(), "1".into())));
}

#[test]
fn gangs_keep_their_names_until_placed_or_gone() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=1");
    let out = env.gang(1, &["cpu=1,g=1", "cpu=1"], "pack");
    assert!(out.iter().any(|d| d.starts_with("infeasible")), "{out:?}");
    assert_eq!(env.core.name_count(), 2);
    env.cancel(1);
    env.cancel(2);
    assert_eq!(env.core.name_count(), 1);
}

#[test]
fn the_name_table_stays_as_large_as_the_names_in_use() {
    let mut env = TestEnv::new();
    env.node(1, "cpu=8");
    // One short-lived resource per task, as the signalling primitive (P2) creates them.
    for t in 1..=2_000u64 {
        let name = format!("done-{t}");
        env.set(1, &name, "1");
        assert_eq!(env.submit(t, &format!("{name}=1")), dispatches(&[(t, 1)]));
        env.finish(t);
        env.delete(1, &name);
        assert!(env.core.name_count() <= 2, "at step {t}");
    }
    assert_eq!(env.core.name_count(), 1);
    assert_eq!(env.core.node(NodeId(1)).unwrap().resources.len(), 1);
}
