//! [`GpuPolicy`]: the one small trait every GPU policy implements, and [`run`], the loop that
//! drives a policy against a [`GpuSeam`] in simulated time.
//!
//! A policy is pure: it hears an [`Event`] with the GPU as it is now and the time, and pushes
//! [`Command`]s; it never sleeps, locks or calls the cluster. That is what lets the same
//! policy run on the in-memory [`SimGpu`](super::SimGpu) in tests and benchmarks and, through
//! the client, on a real cluster.

use super::{Command, Event, GpuSeam, GpuView, SeamError, SimGpu};

/// A GPU partitioning policy (MIGM, MIGRator, Ekya, the baselines).
pub trait GpuPolicy {
    /// Its name, as reports and plots print it.
    fn name(&self) -> String;

    /// Reacts to one event: `gpu` is the GPU now, `now` the time in milliseconds; the commands
    /// go to `out`, in the order they must be carried out.
    fn on_event(&mut self, event: &Event, gpu: &GpuView, now: u64, out: &mut Vec<Command>);

    /// Whether the policy has nothing left to do (every job it was given has finished).
    fn is_done(&self) -> bool;
}

/// What [`run`] saw: every command refused (with why), and when the policy finished.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReport {
    /// Commands the GPU refused, with the time and the reason. A correct policy has none.
    pub refused: Vec<(u64, Command, SeamError)>,
    /// When the policy reported it was done, in milliseconds; `None` if `until` came first.
    pub finished_at: Option<u64>,
}

/// Drives `policy` on `gpu` from its current time until the policy is done or `until`
/// (milliseconds): each tick the GPU advances, its events go to the policy (then one
/// [`Event::Tick`]), and the policy's commands are carried out at once, in order.
pub fn run(policy: &mut dyn GpuPolicy, gpu: &mut SimGpu, until: u64) -> RunReport {
    run_with(policy, gpu, until, |_| {})
}

/// [`run`], calling `each_tick` with the GPU before every tick (to feed arrivals).
pub fn run_with(
    policy: &mut dyn GpuPolicy,
    gpu: &mut SimGpu,
    until: u64,
    mut each_tick: impl FnMut(&mut SimGpu),
) -> RunReport {
    let mut report = RunReport::default();
    let mut out = Vec::new();
    loop {
        let now = gpu.now();
        let mut events = gpu.take_events();
        events.push(Event::Tick);
        for event in &events {
            let view = gpu.view();
            policy.on_event(event, &view, now, &mut out);
            for command in out.drain(..) {
                if let Err(e) = gpu.execute(command.clone()) {
                    tracing::warn!(%command, error = %e, "GPU refused a policy command");
                    report.refused.push((now, command, e));
                }
            }
        }
        if policy.is_done() && !gpu.view().is_active() {
            report.finished_at = Some(now);
            return report;
        }
        if now >= until {
            return report;
        }
        each_tick(gpu);
        gpu.advance();
    }
}
