//! `escher sim-work`: the program a task runs on a simulated GPU (`escher-worker --sim-gpu`).
//!
//! A real GPU job computes for a while, uses memory, and may run out of it. On a simulated GPU
//! this command plays that job: it finds the device its worker gave it (the first UUID in
//! `CUDA_VISIBLE_DEVICES`), asks the head what that device is (model, MIG profile, memory),
//! and runs the job's model of `escher_proto::mig` (`work.rs`) on it:
//!
//! - **time**: `--work` seconds on the whole GPU, using up to `--gpcs` GPCs, take
//!   `work × max(1, gpcs / GPCs of the slice)` on a slice (× 2.2 for a `--pcie-bound` job on a
//!   1g slice), spread over `--iterations`; each simulated second lasts `--scale` wall seconds
//!   (default `$ESCHER_SIM_SCALE`, else 1), so a 200 s window runs in 2 s at 0.01;
//! - **memory**: `--mem-gb` at every iteration, or growing by `--mem-growth-gb` per iteration
//!   (with a seeded `--mem-jitter-gb`); each iteration reports `iteration` and
//!   `mem_requested_gb` as task telemetry (`escher telemetry`), the keys a GPU policy's memory
//!   predictor reads (MIGM's early restart). When the memory
//!   passes the device's, the job stops: it writes `out_of_memory used_mib=.. limit_mib=..` to
//!   its outcome file (`ESCHER_OUTCOME_FILE`) and exits 3, and the worker reports the attempt
//!   as `OutOfMemory`, as it would for a real task that did the same after a CUDA error;
//! - **energy**: at the end it reports `energy_j`, the slice's share of the busy power
//!   (200 W × GPCs / 7) over its run time (`PowerModel`); only ratios are meaningful.
//!
//! A whole simulated GPU (`gpu=1`, or a share of one) runs the job as its full-size profile.
//! It refuses a real GPU: there, the task runs the real program.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use escher_proto::mig::{
    JobModel, MemoryModel, PowerModel, Profile, SimDevice, SpeedModel, find_simulated_device,
};
use escher_proto::types::{NodeGpus, OUTCOME_FILE_ENV, out_of_memory_line};

use super::ctx::Ctx;

/// The environment variable that sets the default `--scale`.
pub const SIM_SCALE_ENV: &str = "ESCHER_SIM_SCALE";

/// Options of `escher sim-work`.
#[derive(Debug, Clone, Args)]
pub struct SimWorkArgs {
    /// Run time on the whole GPU, in simulated seconds
    #[arg(long, value_name = "SECONDS")]
    pub work: f64,

    /// GPCs the job can use (1 to 7): beyond them a larger slice does not help
    #[arg(long, value_name = "N", default_value_t = 7)]
    pub gpcs: u8,

    /// Host-device transfers dominate: 2.2x slower on a 1g slice
    #[arg(long)]
    pub pcie_bound: bool,

    /// Memory the job uses, GB (its first iteration's when it grows)
    #[arg(long, value_name = "GB", default_value_t = 1.0)]
    pub mem_gb: f64,

    /// Memory growth per iteration, GB
    #[arg(long, value_name = "GB", default_value_t = 0.0)]
    pub mem_growth_gb: f64,

    /// Amplitude of the memory's jitter around its trend, GB
    #[arg(long, value_name = "GB", default_value_t = 0.0)]
    pub mem_jitter_gb: f64,

    /// Seed of the jitter
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,

    /// Iterations (one telemetry sample each)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub iterations: u32,

    /// Wall seconds per simulated second [default: $ESCHER_SIM_SCALE, else 1]
    #[arg(long, value_name = "FACTOR")]
    pub scale: Option<f64>,
}

/// The device a task was given, as the head describes it.
type Device = SimDevice;

impl SimWorkArgs {
    fn job(&self) -> anyhow::Result<JobModel> {
        let finite = |v: f64| v.is_finite() && v >= 0.0;
        if !(finite(self.work) && self.work <= 1e7) {
            bail!(
                "--work {}: give a number of seconds from 0 to 10^7",
                self.work
            );
        }
        if !(1..=7).contains(&self.gpcs) {
            bail!("--gpcs {}: a GPU has 1 to 7 GPCs", self.gpcs);
        }
        if !(1..=1_000_000).contains(&self.iterations) {
            bail!("--iterations {}: give 1 to 10^6", self.iterations);
        }
        for (flag, v) in [
            ("mem-gb", self.mem_gb),
            ("mem-growth-gb", self.mem_growth_gb),
            ("mem-jitter-gb", self.mem_jitter_gb),
        ] {
            if !(finite(v) && v <= 1e6) {
                bail!("--{flag} {v}: give a number of GB from 0 to 10^6");
            }
        }
        let memory = if self.mem_growth_gb > 0.0 || self.mem_jitter_gb > 0.0 {
            MemoryModel::Growing {
                base_gb: self.mem_gb,
                per_iteration_gb: self.mem_growth_gb,
                jitter_gb: self.mem_jitter_gb,
                seed: self.seed,
            }
        } else {
            MemoryModel::Fixed { gb: self.mem_gb }
        };
        Ok(JobModel {
            work_s: self.work,
            parallelism: self.gpcs,
            pcie_bound: self.pcie_bound,
            memory,
            iterations: self.iterations,
        })
    }

    fn scale(&self) -> anyhow::Result<f64> {
        let scale = match self.scale {
            Some(s) => s,
            None => match std::env::var(SIM_SCALE_ENV) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .with_context(|| format!("{SIM_SCALE_ENV}={v:?} is not a number"))?,
                Err(_) => 1.0,
            },
        };
        if !(scale.is_finite() && (0.0..=1000.0).contains(&scale)) {
            bail!("--scale {scale}: give a factor from 0 to 1000");
        }
        Ok(scale)
    }

    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let job = self.job()?;
        let scale = self.scale()?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
        let Some(uuid) = visible.split(',').map(str::trim).find(|u| !u.is_empty()) else {
            bail!(
                "escher sim-work runs on a simulated GPU device, and this task was given none \
                 (CUDA_VISIBLE_DEVICES is empty): request one, e.g. --resources mig.1g.5gb=1 \
                 or gpu=1, on a worker started with --sim-gpu"
            );
        };
        let client = ctx.client().await?;
        let nodes = client.gpus().await?;
        let device = find_device(&nodes, uuid)?;
        let speed = SpeedModel::default();
        let duration_s = speed.duration_s(&job, device.profile);
        let step = duration_s / f64::from(job.iterations);
        let mut report_failed = false;
        let mut peak_mib = 0;
        for i in 1..=job.iterations {
            let mem_gb = job.memory.at(i).max(0.0);
            let mem_mib = (mem_gb * 1024.0).round() as u64;
            peak_mib = peak_mib.max(mem_mib);
            let samples = [("iteration", f64::from(i)), ("mem_requested_gb", mem_gb)];
            if let Err(e) = client.report(&samples).await
                && !report_failed
            {
                report_failed = true;
                eprintln!("sim-work: telemetry not reported ({e}); running on");
            }
            if mem_mib > device.memory_mib {
                return out_of_memory(&device, mem_mib, i);
            }
            tokio::time::sleep(Duration::from_secs_f64(step * scale)).await;
        }
        let energy_j = busy_power_w(device.profile) * duration_s;
        let _ = client.report(&[("energy_j", energy_j)]).await;
        println!(
            "sim-work: {} s of work on {} of {} ({}): {duration_s:.2} simulated s ({:.3} s \
             wall), peak {peak_mib} of {} MiB, {energy_j:.0} J",
            job.work_s,
            device.profile.name,
            device.model,
            device.uuid,
            duration_s * scale,
            device.memory_mib
        );
        Ok(ExitCode::SUCCESS)
    }
}

/// The busy power of a slice: its share of the GPU's (`PowerModel`), without the idle floor.
fn busy_power_w(profile: &Profile) -> f64 {
    let power = PowerModel::default();
    power.power_w(profile.compute) - power.power_w(0)
}

/// States the failure in the outcome file and exits 3.
fn out_of_memory(device: &Device, used_mib: u64, iteration: u32) -> anyhow::Result<ExitCode> {
    let line = out_of_memory_line(used_mib, device.memory_mib);
    match std::env::var_os(OUTCOME_FILE_ENV) {
        Some(path) => std::fs::write(&path, &line)
            .with_context(|| format!("cannot write the outcome file {path:?}"))?,
        None => eprintln!("sim-work: no {OUTCOME_FILE_ENV}: the worker will see exit code 3"),
    }
    eprintln!(
        "sim-work: out of memory at iteration {iteration}: {used_mib} MiB needed, {} MiB on {} \
         ({})",
        device.memory_mib, device.profile.name, device.uuid
    );
    Ok(ExitCode::from(3))
}

/// The simulated device `uuid` among the nodes' GPUs: a MIG slice, or a whole GPU.
fn find_device(nodes: &[NodeGpus], uuid: &str) -> anyhow::Result<Device> {
    find_simulated_device(nodes, uuid).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use escher_proto::NodeId;
    use escher_proto::mig::GpuModel;
    use escher_proto::types::{GpuInfo, GpuStatus, MigDevice};

    use super::*;

    fn nodes(simulated: bool) -> Vec<NodeGpus> {
        let info = GpuInfo {
            index: 0,
            uuid: "GPU-a".into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            memory_mib: 40960,
            mig_enabled: true,
            simulated,
            slices: vec![MigDevice {
                profile: "1g.5gb".into(),
                start: 6,
                size: 1,
                memory_mib: 4864,
                uuid: "MIG-b".into(),
            }],
        };
        vec![NodeGpus {
            node: NodeId(1),
            name: "w".into(),
            alive: true,
            gpus: vec![GpuStatus {
                info,
                holders: Vec::new(),
                reconfiguring: None,
                last_error: None,
                last_reconfiguration: None,
            }],
        }]
    }

    #[test]
    fn a_slice_and_a_whole_gpu_are_found() {
        let slice = find_device(&nodes(true), "MIG-b").unwrap();
        assert_eq!((slice.profile.name, slice.memory_mib), ("1g.5gb", 4864));
        let whole = find_device(&nodes(true), "GPU-a").unwrap();
        assert_eq!((whole.profile.name, whole.memory_mib), ("7g.40gb", 40960));
        let real = find_device(&nodes(false), "MIG-b").unwrap_err().to_string();
        assert!(real.contains("real GPU"), "{real}");
        let unknown = find_device(&nodes(true), "MIG-z").unwrap_err().to_string();
        assert!(unknown.contains("no GPU or MIG slice MIG-z"), "{unknown}");
    }

    fn args(extra: &[&str]) -> SimWorkArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimWorkArgs,
        }
        let argv = ["sim-work", "--work", "12"].iter().chain(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn flags_become_a_job_model() {
        let job = args(&["--gpcs", "3", "--mem-gb", "4"]).job().unwrap();
        assert_eq!((job.work_s, job.parallelism, job.iterations), (12.0, 3, 10));
        assert_eq!(job.memory, MemoryModel::Fixed { gb: 4.0 });
        let growing = args(&["--mem-gb", "2", "--mem-growth-gb", "0.5"])
            .job()
            .unwrap();
        assert!((growing.memory.at(4) - 4.0).abs() < 1e-9);
        for bad in [
            &["--gpcs", "8"][..],
            &["--iterations", "0"],
            &["--mem-gb=-1"],
            &["--mem-gb", "NaN"],
        ] {
            assert!(args(bad).job().is_err(), "{bad:?}");
        }
        assert!(args(&["--scale=-1"]).scale().is_err());
        assert_eq!(args(&["--scale", "0.01"]).scale().unwrap(), 0.01);
    }

    #[test]
    fn a_slice_draws_its_share_of_the_busy_power() {
        let m = GpuModel::A100_40GB;
        let p = |n| m.profile(n).unwrap();
        assert!((busy_power_w(p("1g.5gb")) - 200.0 / 7.0).abs() < 1e-9);
        assert!((busy_power_w(p("7g.40gb")) - 200.0).abs() < 1e-9);
    }
}
