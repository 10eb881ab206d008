//! Conversions of the GPU messages: the inventory a worker reports, the devices a task holds,
//! the `Gpus` status and the `ApplyMigLayout` call.
//!
//! A device UUID must be nameable as a resource ([`device_segment`]); a model, when given,
//! must be one escher has a MIG table for; a placement must lie on the 8 memory slices.

use std::time::Duration;

use super::{
    At, ConvertError, MAX_NAME_BYTES, Problem, check_count, check_len, check_name, convert_list,
    convert_required, duration_to_ms, ms_to_duration,
};
use crate::mig::{GpuModel, ReconfigurationCost};
use crate::types::{
    Amount, ApplyMigLayoutRequest, DeviceHold, DeviceHolder, GpuInfo, GpuStatus, GpusReply,
    MigChange, MigDevice, MigPlan, MigProgress, MigReport, NodeGpus, NodeId, TaskId,
    device_segment,
};
use crate::wire;

/// The most GPUs one node reports.
pub const MAX_GPUS: usize = 64;
/// The most MIG devices one GPU reports (7 on every MIG GPU today).
pub const MAX_SLICES: usize = 16;
/// The most devices (or holders) in one list.
pub const MAX_DEVICES: usize = 4096;
/// The longest layout text, in bytes.
pub const MAX_LAYOUT_BYTES: usize = 1024;

fn check_uuid(field: &str, uuid: &str) -> Result<(), ConvertError> {
    check_name(field, uuid, MAX_NAME_BYTES)?;
    if device_segment(uuid).is_none() {
        return Err(ConvertError::new(
            field,
            Problem::Rule(
                "a device UUID starts with a letter or digit and is at most 59 bytes \
                 (GPU-... or MIG-...)",
            ),
        ));
    }
    Ok(())
}

fn amount(raw: u64, field: &str) -> Result<Amount, ConvertError> {
    Amount::from_raw(raw).at(field)
}

impl From<MigDevice> for wire::MigDevice {
    fn from(d: MigDevice) -> Self {
        wire::MigDevice {
            profile: d.profile,
            start: d.start.into(),
            size: d.size.into(),
            memory_mib: d.memory_mib,
            uuid: d.uuid,
        }
    }
}

impl TryFrom<wire::MigDevice> for MigDevice {
    type Error = ConvertError;
    fn try_from(w: wire::MigDevice) -> Result<Self, ConvertError> {
        check_name("profile", &w.profile, 32)?;
        check_uuid("uuid", &w.uuid)?;
        let start = u8::try_from(w.start)
            .ok()
            .filter(|s| *s < 8)
            .ok_or_else(|| ConvertError::new("start", Problem::Rule("must be 0 to 7")))?;
        let size = u8::try_from(w.size)
            .ok()
            .filter(|s| (1..=8).contains(s) && start + s <= 8)
            .ok_or_else(|| {
                ConvertError::new("size", Problem::Rule("must be 1 to 8, ending by slice 8"))
            })?;
        Ok(MigDevice {
            profile: w.profile,
            start,
            size,
            memory_mib: w.memory_mib,
            uuid: w.uuid,
        })
    }
}

impl From<GpuInfo> for wire::GpuInfo {
    fn from(g: GpuInfo) -> Self {
        wire::GpuInfo {
            index: g.index,
            uuid: g.uuid,
            product: g.product,
            model: g.model.map(String::from).unwrap_or_default(),
            memory_mib: g.memory_mib,
            mig_enabled: g.mig_enabled,
            simulated: g.simulated,
            slices: g.slices.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::GpuInfo> for GpuInfo {
    type Error = ConvertError;
    fn try_from(w: wire::GpuInfo) -> Result<Self, ConvertError> {
        check_uuid("uuid", &w.uuid)?;
        check_len("product", &w.product, MAX_NAME_BYTES)?;
        let model = match w.model.as_str() {
            "" => None,
            name => Some(name.parse::<GpuModel>().map_err(|_| {
                ConvertError::new(
                    "model",
                    Problem::Rule("expected a100-40gb, a100-80gb, h100-80gb, h200-141gb or empty"),
                )
            })?),
        };
        Ok(GpuInfo {
            index: w.index,
            uuid: w.uuid,
            product: w.product,
            model,
            memory_mib: w.memory_mib,
            mig_enabled: w.mig_enabled,
            simulated: w.simulated,
            slices: convert_list(w.slices, "slices", MAX_SLICES, MigDevice::try_from)?,
        })
    }
}

/// A list of GPUs, each converted, at most [`MAX_GPUS`].
pub(crate) fn gpu_list(
    items: Vec<wire::GpuInfo>,
    field: &str,
) -> Result<Vec<GpuInfo>, ConvertError> {
    convert_list(items, field, MAX_GPUS, GpuInfo::try_from)
}

impl From<DeviceHold> for wire::DeviceHold {
    fn from(d: DeviceHold) -> Self {
        wire::DeviceHold {
            uuid: d.uuid,
            amount: d.amount.raw(),
        }
    }
}

impl TryFrom<wire::DeviceHold> for DeviceHold {
    type Error = ConvertError;
    fn try_from(w: wire::DeviceHold) -> Result<Self, ConvertError> {
        check_uuid("uuid", &w.uuid)?;
        Ok(DeviceHold {
            uuid: w.uuid,
            amount: amount(w.amount, "amount")?,
        })
    }
}

/// A list of device holds, each converted, at most [`MAX_DEVICES`].
pub(crate) fn hold_list(
    items: Vec<wire::DeviceHold>,
    field: &str,
) -> Result<Vec<DeviceHold>, ConvertError> {
    convert_list(items, field, MAX_DEVICES, DeviceHold::try_from)
}

impl From<DeviceHolder> for wire::DeviceHolder {
    fn from(d: DeviceHolder) -> Self {
        wire::DeviceHolder {
            uuid: d.uuid,
            task_id: d.task.0,
            amount: d.amount.raw(),
        }
    }
}

impl TryFrom<wire::DeviceHolder> for DeviceHolder {
    type Error = ConvertError;
    fn try_from(w: wire::DeviceHolder) -> Result<Self, ConvertError> {
        check_uuid("uuid", &w.uuid)?;
        Ok(DeviceHolder {
            uuid: w.uuid,
            task: TaskId(w.task_id),
            amount: amount(w.amount, "amount")?,
        })
    }
}

impl From<MigProgress> for wire::MigProgress {
    fn from(p: MigProgress) -> Self {
        wire::MigProgress {
            target: p.target,
            retiring: p.retiring,
            waiting_for: p.waiting_for.into_iter().map(|t| t.0).collect(),
            since_at_ms: p.since_ms,
        }
    }
}

impl TryFrom<wire::MigProgress> for MigProgress {
    type Error = ConvertError;
    fn try_from(w: wire::MigProgress) -> Result<Self, ConvertError> {
        check_len("target", &w.target, MAX_LAYOUT_BYTES)?;
        check_count("retiring", w.retiring.len(), MAX_SLICES)?;
        check_count("waiting_for", w.waiting_for.len(), MAX_DEVICES)?;
        Ok(MigProgress {
            target: w.target,
            retiring: w.retiring,
            waiting_for: w.waiting_for.into_iter().map(TaskId).collect(),
            since_ms: w.since_at_ms,
        })
    }
}

impl From<GpuStatus> for wire::GpuStatus {
    fn from(g: GpuStatus) -> Self {
        wire::GpuStatus {
            info: Some(g.info.into()),
            holders: g.holders.into_iter().map(Into::into).collect(),
            reconfiguring: g.reconfiguring.map(Into::into),
            last_error: g.last_error,
            last_reconfiguration: g.last_reconfiguration.map(Into::into),
        }
    }
}

impl TryFrom<wire::GpuStatus> for GpuStatus {
    type Error = ConvertError;
    fn try_from(w: wire::GpuStatus) -> Result<Self, ConvertError> {
        Ok(GpuStatus {
            info: convert_required(w.info, "info")?,
            holders: convert_list(w.holders, "holders", MAX_DEVICES, DeviceHolder::try_from)?,
            reconfiguring: w
                .reconfiguring
                .map(MigProgress::try_from)
                .transpose()
                .at("reconfiguring")?,
            last_error: w.last_error,
            last_reconfiguration: w
                .last_reconfiguration
                .map(MigReport::try_from)
                .transpose()
                .at("last_reconfiguration")?,
        })
    }
}

impl From<ReconfigurationCost> for wire::MigPhases {
    fn from(c: ReconfigurationCost) -> Self {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        wire::MigPhases {
            destroyed: c.destroyed,
            created: c.created,
            destroy_us: us(c.destroy),
            create_us: us(c.create),
            library_load_us: us(c.library_load),
            model_load_us: us(c.model_load),
        }
    }
}

impl From<wire::MigPhases> for ReconfigurationCost {
    fn from(w: wire::MigPhases) -> Self {
        ReconfigurationCost {
            destroyed: w.destroyed,
            created: w.created,
            destroy: Duration::from_micros(w.destroy_us),
            create: Duration::from_micros(w.create_us),
            library_load: Duration::from_micros(w.library_load_us),
            model_load: Duration::from_micros(w.model_load_us),
        }
    }
}

impl From<MigReport> for wire::MigReport {
    fn from(r: MigReport) -> Self {
        wire::MigReport {
            target: r.target,
            asked_at_ms: r.asked_ms,
            done_at_ms: r.done_ms,
            phases: Some(r.phases.into()),
            error: r.error,
        }
    }
}

impl TryFrom<wire::MigReport> for MigReport {
    type Error = ConvertError;
    fn try_from(w: wire::MigReport) -> Result<Self, ConvertError> {
        check_len("target", &w.target, MAX_LAYOUT_BYTES)?;
        Ok(MigReport {
            target: w.target,
            asked_ms: w.asked_at_ms,
            done_ms: w.done_at_ms,
            phases: w.phases.map(Into::into).unwrap_or_default(),
            error: w.error,
        })
    }
}

impl From<NodeGpus> for wire::NodeGpus {
    fn from(n: NodeGpus) -> Self {
        wire::NodeGpus {
            node: n.node.0,
            name: n.name,
            alive: n.alive,
            gpus: n.gpus.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::NodeGpus> for NodeGpus {
    type Error = ConvertError;
    fn try_from(w: wire::NodeGpus) -> Result<Self, ConvertError> {
        Ok(NodeGpus {
            node: NodeId(w.node),
            name: w.name,
            alive: w.alive,
            gpus: convert_list(w.gpus, "gpus", MAX_GPUS, GpuStatus::try_from)?,
        })
    }
}

impl From<GpusReply> for wire::GpusReply {
    fn from(r: GpusReply) -> Self {
        wire::GpusReply {
            nodes: r.nodes.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::GpusReply> for GpusReply {
    type Error = ConvertError;
    fn try_from(w: wire::GpusReply) -> Result<Self, ConvertError> {
        Ok(GpusReply {
            nodes: convert_list(w.nodes, "nodes", usize::MAX, NodeGpus::try_from)?,
        })
    }
}

impl From<ApplyMigLayoutRequest> for wire::ApplyMigLayoutRequest {
    fn from(r: ApplyMigLayoutRequest) -> Self {
        use wire::MigOperation as Op;
        let (operation, layout) = match r.change {
            MigChange::Layout(t) => (Op::Layout, t),
            MigChange::Create(t) => (Op::Create, t),
            MigChange::Destroy(t) => (Op::Destroy, t),
            MigChange::Prepare(t) => (Op::Prepare, t),
        };
        wire::ApplyMigLayoutRequest {
            node: r.node.0,
            gpu: r.gpu,
            layout,
            operation: operation.into(),
            drain: r.drain,
            key: None,
        }
    }
}

impl TryFrom<wire::ApplyMigLayoutRequest> for ApplyMigLayoutRequest {
    type Error = ConvertError;
    fn try_from(w: wire::ApplyMigLayoutRequest) -> Result<Self, ConvertError> {
        use wire::MigOperation as Op;
        check_len("layout", &w.layout, MAX_LAYOUT_BYTES)?;
        let change = match Op::try_from(w.operation) {
            Ok(Op::Layout) => MigChange::Layout(w.layout),
            Ok(Op::Create) => MigChange::Create(w.layout),
            Ok(Op::Destroy) => MigChange::Destroy(w.layout),
            Ok(Op::Prepare) => MigChange::Prepare(w.layout),
            Err(_) => {
                return Err(ConvertError::new(
                    "operation",
                    Problem::UnknownEnum {
                        value: w.operation,
                        expected: "LAYOUT, CREATE, DESTROY, PREPARE",
                    },
                ));
            }
        };
        Ok(ApplyMigLayoutRequest {
            node: NodeId(w.node),
            gpu: w.gpu,
            change,
            drain: w.drain,
        })
    }
}

impl From<MigPlan> for wire::MigPlan {
    fn from(p: MigPlan) -> Self {
        wire::MigPlan {
            node: p.node.0,
            gpu: p.gpu,
            from: p.from,
            to: p.to,
            destroy: p.destroy,
            create: p.create,
            waiting_for: p.waiting_for.into_iter().map(|t| t.0).collect(),
            estimated_ms: duration_to_ms(p.estimated),
        }
    }
}

impl TryFrom<wire::MigPlan> for MigPlan {
    type Error = ConvertError;
    fn try_from(w: wire::MigPlan) -> Result<Self, ConvertError> {
        for (field, text) in [("from", &w.from), ("to", &w.to)] {
            check_len(field, text, MAX_LAYOUT_BYTES)?;
        }
        check_count("destroy", w.destroy.len(), MAX_SLICES)?;
        check_count("create", w.create.len(), MAX_SLICES)?;
        check_count("waiting_for", w.waiting_for.len(), MAX_DEVICES)?;
        Ok(MigPlan {
            node: NodeId(w.node),
            gpu: w.gpu,
            from: w.from,
            to: w.to,
            destroy: w.destroy,
            create: w.create,
            waiting_for: w.waiting_for.into_iter().map(TaskId).collect(),
            estimated: ms_to_duration(w.estimated_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::{amount, round_trip};

    fn gpu() -> GpuInfo {
        GpuInfo {
            index: 1,
            uuid: "GPU-8e2b0a53-3d6b-4d2e-9f1f-2c7a1b9e0d11".into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            memory_mib: 40960,
            mig_enabled: true,
            simulated: true,
            slices: vec![MigDevice {
                profile: "3g.20gb".into(),
                start: 4,
                size: 4,
                memory_mib: 19968,
                uuid: "MIG-41d0c7e2-5b1a-5a8e-b0c3-6f4e2d1a9b77".into(),
            }],
        }
    }

    #[test]
    fn gpu_messages_round_trip() {
        round_trip::<_, wire::GpuInfo>(gpu());
        round_trip::<_, wire::GpuInfo>(GpuInfo {
            model: None,
            mig_enabled: false,
            slices: vec![],
            product: "Tesla T4".into(),
            ..gpu()
        });
        let status = GpuStatus {
            info: gpu(),
            holders: vec![DeviceHolder {
                uuid: "MIG-41d0c7e2-5b1a-5a8e-b0c3-6f4e2d1a9b77".into(),
                task: TaskId(7),
                amount: amount("0.5"),
            }],
            reconfiguring: Some(MigProgress {
                target: "7g.40gb@0".into(),
                retiring: vec!["MIG-41d0c7e2-5b1a-5a8e-b0c3-6f4e2d1a9b77".into()],
                waiting_for: vec![TaskId(7)],
                since_ms: 1234,
            }),
            last_error: Some("boom".into()),
            last_reconfiguration: Some(MigReport {
                target: "1g.5gb@0".into(),
                asked_ms: 1000,
                done_ms: 7100,
                phases: ReconfigurationCost {
                    destroyed: 1,
                    created: 1,
                    destroy: Duration::from_millis(500),
                    create: Duration::from_millis(1500),
                    library_load: Duration::from_millis(1500),
                    model_load: Duration::from_millis(2500),
                },
                error: None,
            }),
        };
        round_trip::<_, wire::GpusReply>(GpusReply {
            nodes: vec![NodeGpus {
                node: NodeId(3),
                name: "w".into(),
                alive: true,
                gpus: vec![status],
            }],
        });
        for change in [
            MigChange::Layout("3g.20gb,2g.10gb".into()),
            MigChange::Create("1g.5gb@6".into()),
            MigChange::Destroy("MIG-41d0c7e2-5b1a-5a8e-b0c3-6f4e2d1a9b77".into()),
            MigChange::Prepare("4g.20gb,3g.20gb".into()),
        ] {
            round_trip::<_, wire::ApplyMigLayoutRequest>(ApplyMigLayoutRequest {
                node: NodeId(1),
                gpu: 0,
                change,
                drain: true,
            });
        }
        let mut unknown = wire::ApplyMigLayoutRequest::from(ApplyMigLayoutRequest {
            node: NodeId(1),
            gpu: 0,
            change: MigChange::Create("1g.5gb".into()),
            drain: false,
        });
        unknown.operation = 9;
        let e = ApplyMigLayoutRequest::try_from(unknown)
            .unwrap_err()
            .to_string();
        assert!(e.contains("operation") && e.contains("PREPARE"), "{e}");
        round_trip::<_, wire::MigPlan>(MigPlan {
            node: NodeId(1),
            gpu: 0,
            from: "7g.40gb@0".into(),
            to: "4g.20gb@0,3g.20gb@4".into(),
            destroy: vec!["7g.40gb@0".into()],
            create: vec!["4g.20gb@0".into(), "3g.20gb@4".into()],
            waiting_for: vec![TaskId(2)],
            estimated: Duration::from_millis(12_500),
        });
    }

    #[test]
    fn bad_gpu_messages_name_the_field() {
        let mut w = wire::GpuInfo::from(gpu());
        w.model = "a30".into();
        assert_eq!(GpuInfo::try_from(w).unwrap_err().path(), "model");
        let mut w = wire::GpuInfo::from(gpu());
        w.uuid = "/dev/nvidia0".into();
        assert_eq!(GpuInfo::try_from(w).unwrap_err().path(), "uuid");
        let mut w = wire::GpuInfo::from(gpu());
        w.slices[0].start = 8;
        assert_eq!(GpuInfo::try_from(w).unwrap_err().path(), "slices[0].start");
        let mut w = wire::GpuInfo::from(gpu());
        w.slices[0].start = 6;
        assert_eq!(GpuInfo::try_from(w).unwrap_err().path(), "slices[0].size");
        let bad = wire::DeviceHold {
            uuid: String::new(),
            amount: 1,
        };
        assert_eq!(
            DeviceHold::try_from(bad).unwrap_err().to_string(),
            "uuid: must not be empty"
        );
        let long = wire::ApplyMigLayoutRequest {
            layout: "1g.5gb,".repeat(200),
            ..Default::default()
        };
        assert_eq!(
            ApplyMigLayoutRequest::try_from(long).unwrap_err().path(),
            "layout"
        );
        let status = wire::GpuStatus::default();
        assert_eq!(
            GpuStatus::try_from(status).unwrap_err().to_string(),
            "missing field info"
        );
    }
}
