//! The in-memory GPU the policies are tested and measured on: [`SimGpu`] (the fake at the
//! [`GpuSeam`](super::GpuSeam)), and the models of what it runs, which live in
//! [`escher_proto::mig`] (`work.rs`) because the framework's simulated GPU runs them too.

mod gpu;

pub use escher_proto::mig::{InferenceModel, JobModel, MemoryModel, PowerModel, SpeedModel};
pub use gpu::{SimGpu, TaskModel, TaskStats};
