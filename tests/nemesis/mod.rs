//! A fault-injection harness with a history checker, the way raft systems are checked
//! (Jepsen with Knossos and Elle, etcd's robustness tests with Porcupine): real `escher-head`
//! replicas and `escher-worker`s on hosts of their own (network namespaces), clients that
//! record every operation, tasks that record every execution, nemeses that partition, slow,
//! pause, kill and starve them, and a checker of escher's invariants over the whole history.
//!
//! # Layout
//!
//! - [`net`]: the hosts (namespaces on a bridge) and the network faults.
//! - [`cluster`]: the head replicas and workers in those hosts, and the process and disk faults.
//! - [`nemeses`]: each fault as a nemesis that injects and heals.
//! - [`history`]: what is recorded, and the tasks' execution log.
//! - [`checker`]: the rules, each with its tests on hand-made histories (its
//!   [`reruns`](checker::reruns): an attempt run twice, a task run again after its end, an
//!   execution the head never assigned; its [`capacity`](checker::capacity): each node's
//!   capacity over time); [`linear`]: the counter's linearizability.
//! - [`run`]: a schedule under load, the check, and the table of measurements.

pub mod checker;
pub mod cluster;
pub mod history;
pub mod linear;
pub mod nemeses;
pub mod net;
pub mod run;
