//! The in-memory GPU the policies are tested and measured on: [`SimGpu`] (the fake at the
//! [`GpuSeam`](super::GpuSeam)) and the models of what it runs (`model.rs`).

mod gpu;
mod model;

pub use gpu::{SimGpu, TaskModel, TaskStats};
pub use model::{InferenceModel, JobModel, MemoryModel, PowerModel, SpeedModel};
