//! The GPU side of the worker's event loop (`runtime.rs`): telling the head which devices a
//! task got, handing devices to tasks that wait for them, and MIG reconfigurations (asked
//! for, started once their slices are free, reported when done). Same state, same loop; kept
//! apart only to keep each file readable.

use escher_proto::types::{DeviceHold, MigDone, WorkerMessage, is_gpu_resource};
use escher_proto::{ResourceSet, TaskId};

use super::Runtime;
use crate::gpu::{BindError, Reconfigured};

impl Runtime {
    /// A task got its devices: tells the head which (if any) and that it started; returns the
    /// device list its environment shows.
    pub(super) fn started(
        &mut self,
        (task_id, attempt): (TaskId, u32),
        holds: &[DeviceHold],
    ) -> Option<Vec<String>> {
        if !holds.is_empty() {
            self.send(WorkerMessage::TaskDevices {
                task_id,
                attempt,
                devices: holds.to_vec(),
            });
        }
        self.report_start(task_id, attempt);
        self.gpus.visible(holds)
    }

    /// Gives waiting tasks their devices where they fit now, in arrival order.
    pub(super) fn retry_waiting(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].grant.is_closed() {
                self.waiting.remove(i);
                continue;
            }
            let seq = self.waiting[i].seq;
            match self.gpus.bind(seq, &self.waiting[i].allocation) {
                Err(BindError::Wait(_)) => i += 1,
                Err(BindError::Never(why)) => {
                    let w = self.waiting.remove(i);
                    let _ = w.grant.send(Err(format!(
                        "worker {} cannot give this task its GPU devices: {why}",
                        self.me.name
                    )));
                }
                Ok(holds) => {
                    let w = self.waiting.remove(i);
                    let visible = self.started(w.key, &holds);
                    if w.grant.send(Ok(visible)).is_err() {
                        self.gpus.release(seq);
                    }
                }
            }
        }
    }

    /// The head asks for a MIG layout: retire the slices it destroys, and start it if they
    /// are free already.
    pub(super) fn reconfigure(&mut self, gpu: u32, layout: &str) {
        match self.gpus.request(gpu, layout) {
            Ok(()) => {
                tracing::info!(gpu, %layout, "MIG reconfiguration asked for");
                self.refresh_resources();
                self.start_reconfigurations();
            }
            Err(why) => {
                tracing::warn!(gpu, %layout, %why, "refusing a MIG reconfiguration");
                let done = MigDone {
                    gpu,
                    error: Some(why),
                    phases: Default::default(),
                };
                self.send_gpus(Some(done));
            }
        }
    }

    /// Starts the reconfigurations whose slices are free, each off the loop.
    pub(super) fn start_reconfigurations(&mut self) {
        for job in self.gpus.take_ready() {
            let tx = self.mig_tx.clone();
            self.tracker.spawn(async move {
                let result = job.run().await;
                // The receiver lives as long as the runtime, which waits for every job.
                let _ = tx.send(result);
            });
        }
    }

    /// A reconfiguration job ended.
    pub(super) fn on_reconfigured(&mut self, done: Reconfigured) {
        let done = self.gpus.finish(done);
        match &done.error {
            None => {
                tracing::info!(gpu = done.gpu, phases = ?done.phases, "MIG reconfiguration done")
            }
            Some(why) => tracing::warn!(gpu = done.gpu, %why, "MIG reconfiguration failed"),
        }
        self.refresh_resources();
        self.send_gpus(Some(done));
        self.retry_waiting();
    }

    /// Tells the head the GPUs as they are now (nothing on a node without GPUs).
    pub(super) fn send_gpus(&mut self, done: Option<MigDone>) {
        if self.gpus.is_empty() {
            return;
        }
        let gpus = self.gpus.inventory().to_vec();
        self.send(WorkerMessage::GpusChanged { gpus, done });
    }

    /// Makes the registered resources' GPU part match the GPUs now (for a later registration).
    pub(super) fn refresh_resources(&mut self) {
        if self.gpus.is_empty() {
            return;
        }
        let mut set = ResourceSet::new();
        for (name, amount) in self.me.resources.iter() {
            if !is_gpu_resource(name.as_str()) {
                set.insert(name.clone(), amount);
            }
        }
        for (name, amount) in self.gpus.resources().iter() {
            set.insert(name.clone(), amount);
        }
        self.me.resources = set;
    }
}
