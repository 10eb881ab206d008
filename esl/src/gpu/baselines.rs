//! The baselines the GPU policies are measured against, each small.
//!
//! - [`Sequential`]: MIGM's baseline, the unpartitioned GPU (one `7g` instance) running one
//!   job at a time in arrival order.

use std::collections::VecDeque;

use escher_proto::mig::{GpuModel, Placement};
use escher_proto::types::TaskId;

use super::{Command, Event, GpuPolicy, GpuView, InstanceState};

/// One job at a time on the whole GPU, first in first out (MIGM §5's baseline).
#[derive(Debug, Clone)]
pub struct Sequential {
    whole: Placement,
    queue: VecDeque<TaskId>,
    running: Option<TaskId>,
    failed: Vec<TaskId>,
}

impl Sequential {
    /// The baseline on a GPU of `model`.
    pub fn new(model: GpuModel) -> Sequential {
        let whole = model
            .base_profiles()
            .max_by_key(|p| p.compute)
            .expect("every model has a whole-GPU profile");
        Sequential {
            whole: Placement::new(whole, 0),
            queue: VecDeque::new(),
            running: None,
            failed: Vec::new(),
        }
    }

    /// Queues a job.
    pub fn submit(&mut self, task: TaskId) {
        self.queue.push_back(task);
    }

    /// Jobs that ran out of memory on the whole GPU.
    pub fn failed(&self) -> &[TaskId] {
        &self.failed
    }
}

impl GpuPolicy for Sequential {
    fn name(&self) -> String {
        "sequential (full GPU)".into()
    }

    fn on_event(&mut self, event: &Event, gpu: &GpuView, _now: u64, out: &mut Vec<Command>) {
        match event {
            Event::Finished(t) if self.running == Some(*t) => self.running = None,
            Event::OutOfMemory { task, .. } if self.running == Some(*task) => {
                self.running = None;
                self.failed.push(*task);
            }
            _ => {}
        }
        if self.running.is_some() {
            return;
        }
        let whole = gpu.at(0).filter(|i| i.placement == self.whole);
        match whole.map(|i| i.state) {
            None => {
                // Make the GPU whole: destroy every idle instance, then create the 7g.
                if gpu.instances.iter().all(|i| i.state == InstanceState::Idle) {
                    out.extend(gpu.instances.iter().map(|i| Command::Destroy(i.placement)));
                    out.push(Command::Create(self.whole));
                }
            }
            Some(InstanceState::Idle) => {
                if let Some(task) = self.queue.pop_front() {
                    out.push(Command::Launch {
                        task,
                        on: self.whole,
                    });
                    self.running = Some(task);
                }
            }
            Some(_) => {}
        }
    }

    fn is_done(&self) -> bool {
        self.queue.is_empty() && self.running.is_none()
    }
}
