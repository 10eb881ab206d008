//! The rules of [`Protocol`], driven with hand-picked times.

use std::time::Duration;

use escher_proto::types::{RunningTask, TaskFinished, TaskId, TaskResult};

use super::{Admit, Protocol, Renewal};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn key(task: u64, attempt: u32) -> (TaskId, u32) {
    (TaskId(task), attempt)
}

fn report(task: u64, attempt: u32) -> TaskFinished {
    TaskFinished {
        task_id: TaskId(task),
        attempt,
        outcome: Ok(TaskResult::Exited { code: 0 }),
        timed_out: false,
        output: None,
    }
}

/// A protocol attached at 0 with a lease of 1 s.
fn attached() -> Protocol<u32> {
    let mut p = Protocol::new();
    assert_eq!(p.attached(ms(0), Some(ms(1_000)), ms(5)), None);
    p
}

#[test]
fn an_attempt_starts_once_whatever_became_of_it() {
    let mut p = attached();
    assert_eq!(p.admit(key(1, 1), ms(10)), Admit::Start);
    p.run(key(1, 1), 7);
    // Sent again while it runs, after it ended, after it was reported and acknowledged.
    assert_eq!(p.admit(key(1, 1), ms(20)), Admit::Again);
    assert_eq!(p.ended(&key(1, 1)), Some(7));
    assert_eq!(p.admit(key(1, 1), ms(30)), Admit::Again);
    p.finished(report(1, 1));
    p.acked([key(1, 1)]);
    assert_eq!(p.admit(key(1, 1), ms(40)), Admit::Again);
    // Another attempt of the same task is another attempt.
    assert_eq!(p.admit(key(1, 2), ms(50)), Admit::Start);
}

#[test]
fn an_attempt_refused_is_never_started_later() {
    let mut p = attached();
    assert_eq!(
        p.admit(key(3, 1), ms(1_200)),
        Admit::Lapsed { silent: ms(1_200) }
    );
    // The lease is renewed: the same attempt sent again still does not start.
    let seq = p.heartbeat(ms(1_300));
    assert!(p.renewed(seq, ms(1_310)).is_some());
    assert_eq!(p.admit(key(3, 1), ms(1_320)), Admit::Again);
}

#[test]
fn nothing_starts_once_the_lease_has_run_out() {
    let mut p = attached();
    assert_eq!(p.admit(key(1, 1), ms(999)), Admit::Start);
    assert_eq!(
        p.admit(key(2, 1), ms(1_000)),
        Admit::Lapsed { silent: ms(1_000) }
    );
    assert!(p.leased(ms(999)) && !p.leased(ms(1_000)));
    assert_eq!(p.lapsed(ms(999)), None);
    assert_eq!(p.lapsed(ms(1_500)), Some(ms(1_500)));
    assert_eq!(p.lease_end(), Some(ms(1_000)));
}

#[test]
fn before_any_lease_nothing_lapses() {
    let mut p: Protocol<u32> = Protocol::new();
    assert_eq!(p.lapsed(ms(10_000)), None);
    assert!(!p.leased(ms(0)));
    assert_eq!(p.lease_end(), None);
    assert_eq!(p.stale(ms(10_000)), None);
    // A head that grants no lease (an old one): its assignments start.
    assert_eq!(p.attached(ms(0), None, ms(1)), None);
    assert_eq!(p.admit(key(1, 1), ms(60_000)), Admit::Start);
}

#[test]
fn a_renewal_runs_the_lease_from_when_its_heartbeat_was_sent() {
    let mut p = attached();
    let first = p.heartbeat(ms(400));
    let second = p.heartbeat(ms(500));
    // The second is renewed first: the first is forgotten with it.
    assert_eq!(
        p.renewed(second, ms(900)),
        Some(Renewal {
            sent: ms(500),
            lapsed: None
        })
    );
    assert_eq!(p.renewed(first, ms(950)), None);
    assert_eq!(p.lease_end(), Some(ms(1_500)));
    // A later registration sent before the last renewal does not move the lease back.
    assert_eq!(p.attached(ms(450), Some(ms(1_000)), ms(960)), None);
    assert_eq!(p.lease_end(), Some(ms(1_500)));
    // The beats of the old stream are gone with it.
    let third = p.heartbeat(ms(1_000));
    assert_eq!(p.renewed(third, ms(1_010)).map(|r| r.sent), Some(ms(1_000)));
}

#[test]
fn a_renewal_after_the_lease_ran_out_says_the_fence_goes_first() {
    let mut p = attached();
    let seq = p.heartbeat(ms(100));
    // The worker was frozen: it reads the renewal at 1.4 s.
    assert_eq!(
        p.renewed(seq, ms(1_400)),
        Some(Renewal {
            sent: ms(100),
            lapsed: Some(ms(1_400))
        })
    );
    // Now the lease runs until 1.1 s, so it has run out still.
    assert_eq!(p.lapsed(ms(1_400)), Some(ms(1_300)));
    // A registration after a long cut: the fence first, then the new lease.
    assert_eq!(
        p.attached(ms(3_000), Some(ms(1_000)), ms(3_050)),
        Some(ms(2_950))
    );
    assert_eq!(p.lapsed(ms(3_050)), None);
}

#[test]
fn a_replica_silent_for_half_the_lease_is_left() {
    let p = attached();
    assert_eq!(p.stale(ms(500)), None);
    assert_eq!(p.stale(ms(501)), Some(ms(501)));
}

#[test]
fn reports_are_kept_until_acknowledged_and_listed_by_a_registration() {
    let mut p = attached();
    for task in 1..=3 {
        assert_eq!(p.admit(key(task, 1), ms(10)), Admit::Start);
        p.run(key(task, 1), 0);
    }
    p.ended(&key(1, 1));
    p.finished(report(1, 1));
    p.ended(&key(2, 1));
    p.finished(report(2, 1));
    p.acked([key(2, 1)]);
    assert_eq!(p.unacked_count(), 1);
    // The stream breaks: the registration lists what runs and what no head acknowledged.
    let rejoin = p.rejoin();
    assert_eq!(
        rejoin.running,
        vec![RunningTask {
            task_id: TaskId(3),
            attempt: 1
        }]
    );
    assert_eq!(rejoin.finished, vec![report(1, 1)]);
    // Task 3 ends while the registration is under way: its report is not in it.
    p.ended(&key(3, 1));
    p.finished(report(3, 1));
    // The answer acknowledges what it carried; task 3's report is sent again now.
    assert_eq!(p.registered(), vec![report(3, 1)]);
    assert_eq!(p.unacked(&key(1, 1)), None);
    assert_eq!(p.unacked(&key(3, 1)), Some(&report(3, 1)));
    // A registration never answered carries everything again in the next one.
    let again = p.rejoin();
    assert_eq!(again.finished, vec![report(3, 1)]);
    let next = p.rejoin();
    assert_eq!(next, again);
}

#[test]
fn a_restored_head_lets_ended_attempts_go_but_not_running_ones() {
    let mut p = attached();
    assert_eq!(p.admit(key(1, 1), ms(10)), Admit::Start);
    p.run(key(1, 1), 0);
    assert_eq!(p.admit(key(2, 1), ms(10)), Admit::Start);
    p.forget_ended();
    assert_eq!(p.admit(key(1, 1), ms(20)), Admit::Again);
    assert_eq!(p.admit(key(2, 1), ms(20)), Admit::Start);
}

#[test]
fn a_node_the_head_forgot_owes_nothing() {
    let mut p = attached();
    assert_eq!(p.admit(key(1, 1), ms(10)), Admit::Start);
    p.run(key(1, 1), 4);
    p.finished(report(9, 1));
    let _ = p.rejoin();
    let ran = p.forget_all();
    assert_eq!(ran.into_iter().collect::<Vec<_>>(), vec![(key(1, 1), 4)]);
    assert_eq!(p.unacked_count(), 0);
    assert_eq!(p.registered(), Vec::new());
    assert_eq!(p.admit(key(1, 1), ms(20)), Admit::Start);
}
