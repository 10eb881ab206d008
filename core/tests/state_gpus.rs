//! GPUs in the head's state machine: a worker's GPU inventory, the devices tasks report
//! holding, and MIG reconfiguration: validated, refused while busy, drained on request, the
//! resource table changing atomically at its start and its end.

mod state_support;

use std::collections::BTreeSet;

use escher_core::state::{ApplyError, Command, Joining, Reply, SecretHash};
use escher_proto::Amount;
use std::time::Duration;

use escher_proto::mig::{GpuModel, ReconfigurationCost};
use escher_proto::types::{
    DeviceHold, GpuInfo, Labels, MigChange, MigDevice, MigDone, MigPlan, MigRefusal, NodeId,
    TaskId, TaskState, gpu_resources,
};
use state_support::{TestState, res, task};

fn slice(profile: &str, start: u8, size: u8, uuid: &str) -> MigDevice {
    MigDevice {
        profile: profile.into(),
        start,
        size,
        memory_mib: 4864 * u64::from(size),
        uuid: uuid.into(),
    }
}

/// GPU 0: an A100-40GB in MIG mode, 1g.5gb at 0 and 1, 2g.10gb at 2, 3g.20gb at 4.
/// GPU 1: an H100 not in MIG mode.
fn gpus() -> Vec<GpuInfo> {
    vec![
        GpuInfo {
            index: 0,
            uuid: "GPU-a100".into(),
            product: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            memory_mib: 40960,
            mig_enabled: true,
            simulated: true,
            slices: vec![
                slice("1g.5gb", 0, 1, "MIG-a"),
                slice("1g.5gb", 1, 1, "MIG-b"),
                slice("2g.10gb", 2, 2, "MIG-c"),
                slice("3g.20gb", 4, 4, "MIG-d"),
            ],
        },
        GpuInfo {
            index: 1,
            uuid: "GPU-h100".into(),
            product: "NVIDIA H100 80GB HBM3".into(),
            model: Some(GpuModel::H100_80GB),
            memory_mib: 81920,
            mig_enabled: false,
            simulated: true,
            slices: vec![],
        },
    ]
}

/// A node registered as a worker with `gpus` registers: resources, then its inventory.
fn gpu_node(t: &mut TestState, gpus: Vec<GpuInfo>) -> NodeId {
    let mut resources = res("cpu=16");
    for (n, a) in gpu_resources(&gpus, &BTreeSet::new()).iter() {
        resources.insert(n.clone(), a);
    }
    let node = match t
        .apply(Command::RegisterNode {
            worker: Joining {
                name: "gpu-box".into(),
                address: "gpu-box:7601".into(),
                resources,
                labels: Labels::new(),
                gpus: Vec::new(),
                boot: 1,
            },
            secret: SecretHash::of("gpu-box"),
        })
        .reply
    {
        Reply::Registered(id) => id,
        other => panic!("{other:?}"),
    };
    let fx = t
        .apply(Command::GpusChanged {
            node,
            gpus,
            done: None,
        })
        .fx();
    assert!(
        fx.is_empty(),
        "the first report matches the registration: {fx:?}"
    );
    node
}

fn total(t: &TestState, node: NodeId, name: &str) -> String {
    t.slot(node, name)
        .map_or("-".into(), |(total, used)| format!("{total}/{used}"))
}

fn apply_layout(
    t: &mut TestState,
    node: NodeId,
    gpu: u32,
    layout: &str,
    drain: bool,
) -> Result<(MigPlan, Vec<String>), ApplyError> {
    change(t, node, gpu, MigChange::Layout(layout.into()), drain)
}

fn change(
    t: &mut TestState,
    node: NodeId,
    gpu: u32,
    change: MigChange,
    drain: bool,
) -> Result<(MigPlan, Vec<String>), ApplyError> {
    let out = t.try_apply(Command::ApplyMigLayout {
        node,
        gpu,
        change,
        drain,
    })?;
    match out.reply {
        Reply::MigPlan(ref plan) => Ok((plan.clone(), out.fx())),
        ref other => panic!("{other:?}"),
    }
}

fn devices(t: &mut TestState, task: TaskId, uuids: &[&str]) {
    let attempt = t.state.task(task).unwrap().attempt;
    t.apply(Command::TaskDevices {
        task,
        attempt,
        devices: uuids
            .iter()
            .map(|u| DeviceHold {
                uuid: (*u).into(),
                amount: Amount::ONE,
            })
            .collect(),
    });
}

/// The worker finished: GPU 0 now has `slices`.
fn done(t: &mut TestState, node: NodeId, slices: Vec<MigDevice>) -> Vec<String> {
    let mut now = gpus();
    now[0].slices = slices;
    t.apply(Command::GpusChanged {
        node,
        gpus: now,
        done: Some(MigDone {
            gpu: 0,
            error: None,
            phases: Box::default(),
        }),
    })
    .fx()
}

#[test]
fn bad_requests_are_refused_and_change_nothing() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    let err = |t: &mut TestState, node, gpu, layout: &str| {
        apply_layout(t, node, gpu, layout, false).unwrap_err()
    };
    let e = err(&mut t, node, 0, "3g.20gb,3g.20gb,1g.5gb");
    assert!(matches!(e, ApplyError::InvalidLayout { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "invalid MIG layout \"3g.20gb,3g.20gb,1g.5gb\" for GPU 0 of node 1 (a100-40gb): layout \
         entry 3 (\"1g.5gb\"): 1g.5gb needs 1 memory slice(s) but only 0 of 8 are free"
    );
    let e = err(&mut t, node, 1, "7g.80gb");
    assert!(
        e.to_string()
            .contains("is a simulated GPU without MIG mode")
            && e.to_string().contains("--sim-gpu"),
        "{e}"
    );
    // A real GPU out of MIG mode: the advice is nvidia-smi's.
    let mut real = gpus();
    real[1].simulated = false;
    let other = gpu_node(&mut t, real);
    let e = err(&mut t, other, 1, "7g.80gb");
    assert!(
        e.to_string().contains("is not in MIG mode") && e.to_string().contains("nvidia-smi"),
        "{e}"
    );
    let e = err(&mut t, node, 7, "7g.40gb");
    assert_eq!(
        e.to_string(),
        "node 1 has no GPU 7; its GPU indices are: 0, 1 (see `escher gpus`)"
    );
    assert!(e.is_not_found());
    assert!(matches!(
        err(&mut t, NodeId(9), 0, "7g.40gb"),
        ApplyError::UnknownNode(_)
    ));
    // A node without GPUs.
    let plain = t.node("plain", "cpu=1");
    assert!(
        err(&mut t, plain, 0, "7g.40gb")
            .to_string()
            .contains("indices are: none")
    );
}

#[test]
fn an_unchanged_layout_does_nothing() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    let (plan, fx) = apply_layout(
        &mut t,
        node,
        0,
        "3g.20gb@4,1g.5gb@0,1g.5gb@1,2g.10gb@2",
        false,
    )
    .unwrap();
    assert!(plan.is_unchanged());
    assert_eq!(plan.from, "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4");
    assert!(fx.is_empty());
    assert!(
        t.state.gpu_status().nodes[0].gpus[0]
            .reconfiguring
            .is_none()
    );
}

#[test]
fn reconfiguring_a_busy_slice_is_refused() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    let (small, fx) = t.submit(task("mig.1g.5gb=1"));
    assert_eq!(fx, [format!("assign {small}->{node} #1")]);
    // A change that destroys no 1g slice does not care where the task is.
    let four_1g = "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,3g.20gb@4";
    apply_layout(&mut t, node, 0, four_1g, false).unwrap();
    let after = vec![
        slice("1g.5gb", 0, 1, "MIG-a"),
        slice("1g.5gb", 1, 1, "MIG-b"),
        slice("1g.5gb", 2, 1, "MIG-f"),
        slice("1g.5gb", 3, 1, "MIG-g"),
        slice("3g.20gb", 4, 4, "MIG-d"),
    ];
    done(&mut t, node, after.clone());
    // Before the worker says which slice it got, any 1g.5gb slice may be the one.
    let e = apply_layout(&mut t, node, 0, "1g.5gb@0,2g.10gb@2,3g.20gb@4", false).unwrap_err();
    assert!(matches!(e, ApplyError::MigBusy { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("may be in use by task(s) {small}")),
        "{e}"
    );
    // Once it says it holds MIG-a (1g@0, which that change keeps), the change may go.
    devices(&mut t, small, &["MIG-a"]);
    apply_layout(&mut t, node, 0, "1g.5gb@0,2g.10gb@2,3g.20gb@4", false).unwrap();
    done(
        &mut t,
        node,
        vec![
            slice("1g.5gb", 0, 1, "MIG-a"),
            slice("2g.10gb", 2, 2, "MIG-h"),
            slice("3g.20gb", 4, 4, "MIG-d"),
        ],
    );
    // A change that destroys MIG-a is refused.
    let e = apply_layout(&mut t, node, 0, "7g.40gb", false).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "GPU 0 of node {node} cannot be reconfigured now: slice 1g.5gb@0 (MIG-a) may be in \
             use by task(s) {small}; wait for those tasks, or ask to drain (--drain) so that \
             nothing new is placed on those slices and the change happens once they are free"
        )
    );
    let status = t.state.gpu_status();
    let holders = &status.nodes[0].gpus[0].holders;
    assert_eq!(holders.len(), 1);
    assert_eq!(
        (holders[0].uuid.as_str(), holders[0].task),
        ("MIG-a", small)
    );
}

#[test]
fn a_reconfiguration_swaps_the_resources_atomically() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    assert_eq!(total(&t, node, "mig.1g.5gb"), "2/0");
    assert_eq!(total(&t, node, "gpu"), "1/0");
    let (holder, _) = t.submit(task("mig.1g.5gb=1"));
    devices(&mut t, holder, &["MIG-a"]);
    // Keep 1g@0 (busy) and 1g@1; turn 2g@2 and 3g@4 into 1g@2, 1g@3 and a 3g... at 4 again
    // would be unchanged, so: 2g@2 -> two 1g, 3g@4 stays.
    let (plan, fx) = apply_layout(
        &mut t,
        node,
        0,
        "1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,3g.20gb@4",
        false,
    )
    .unwrap();
    assert_eq!(plan.destroy, ["2g.10gb@2"]);
    assert_eq!(plan.create, ["1g.5gb@2", "1g.5gb@3"]);
    assert!(plan.waiting_for.is_empty());
    assert_eq!(plan.estimated.as_millis(), 500 + 2 * 5500);
    assert_eq!(
        fx,
        [format!(
            "mig {node}/0 1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,3g.20gb@4"
        )]
    );
    // At once: the 2g and its identity are gone; nothing else moved.
    assert_eq!(total(&t, node, "mig.2g.10gb"), "-");
    assert_eq!(total(&t, node, "mig.MIG-c"), "-");
    assert_eq!(total(&t, node, "mig.1g.5gb"), "2/1");
    // A task for the 2g cannot be placed on the slice being rebuilt.
    let (wants_2g, fx) = t.submit(task("mig.2g.10gb=1"));
    assert!(fx.is_empty());
    assert_eq!(t.task_state(wants_2g), TaskState::Pending);
    let status = t.state.gpu_status();
    let progress = status.nodes[0].gpus[0].reconfiguring.as_ref().unwrap();
    assert_eq!(progress.retiring, ["MIG-c"]);
    // A second change while this one runs is refused.
    let e = apply_layout(&mut t, node, 0, "7g.40gb", true).unwrap_err();
    assert!(matches!(e, ApplyError::MigInProgress { .. }), "{e}");
    // The worker reports the new slices: they join the table, and 1g tasks run on them.
    let fx = done(
        &mut t,
        node,
        vec![
            slice("1g.5gb", 0, 1, "MIG-a"),
            slice("1g.5gb", 1, 1, "MIG-b"),
            slice("1g.5gb", 2, 1, "MIG-f"),
            slice("1g.5gb", 3, 1, "MIG-g"),
            slice("3g.20gb", 4, 4, "MIG-d"),
        ],
    );
    assert!(fx.is_empty());
    assert_eq!(total(&t, node, "mig.1g.5gb"), "4/1");
    assert_eq!(total(&t, node, "mig.MIG-f"), "1/0");
    assert_eq!(t.task_state(wants_2g), TaskState::Pending);
    let mut placed = Vec::new();
    for _ in 0..3 {
        let (id, fx) = t.submit(task("mig.1g.5gb=1"));
        assert_eq!(fx.len(), 1, "{fx:?}");
        placed.push(id);
    }
    let (fourth, fx) = t.submit(task("mig.1g.5gb=1"));
    assert!(fx.is_empty(), "all four 1g slices are held");
    assert_eq!(t.task_state(fourth), TaskState::Pending);
    assert!(
        t.state.gpu_status().nodes[0].gpus[0]
            .reconfiguring
            .is_none()
    );
}

#[test]
fn draining_waits_for_busy_slices_and_admits_nothing_new_to_them() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    let (a, _) = t.submit(task("mig.1g.5gb=1"));
    devices(&mut t, a, &["MIG-a"]);
    let (plan, fx) = apply_layout(&mut t, node, 0, "7g.40gb", true).unwrap();
    assert_eq!(plan.waiting_for, [a]);
    assert_eq!(plan.destroy.len(), 4);
    assert_eq!(fx, [format!("mig {node}/0 7g.40gb@0")]);
    // Every slice's capacity is gone at once; the held one stays held.
    assert_eq!(total(&t, node, "mig.1g.5gb"), "0/1");
    // (The task asked for the class, not the identity: the identity goes at once.)
    assert_eq!(total(&t, node, "mig.MIG-a"), "-");
    let (b, fx) = t.submit(task("mig.1g.5gb=1"));
    assert!(
        fx.is_empty(),
        "nothing is admitted to a slice being drained"
    );
    let status = t.state.gpu_status();
    assert_eq!(
        status.nodes[0].gpus[0]
            .reconfiguring
            .as_ref()
            .unwrap()
            .waiting_for,
        [a]
    );
    // The holder ends; the slice's last resource goes; the change is still the worker's.
    t.exit(a, 0);
    assert_eq!(total(&t, node, "mig.1g.5gb"), "-");
    let status = t.state.gpu_status();
    assert!(
        status.nodes[0].gpus[0]
            .reconfiguring
            .as_ref()
            .unwrap()
            .waiting_for
            .is_empty()
    );
    let fx = done(&mut t, node, vec![slice("7g.40gb", 0, 8, "MIG-full")]);
    assert!(fx.is_empty());
    assert_eq!(total(&t, node, "mig.7g.40gb"), "1/0");
    assert_eq!(t.task_state(b), TaskState::Pending, "no 1g slice any more");
    let (big, fx) = t.submit(task("mig.7g.40gb=1"));
    assert_eq!(fx, [format!("assign {big}->{node} #1")]);
    // The whole H100 was never touched.
    assert_eq!(total(&t, node, "gpu"), "1/0");
    assert_eq!(total(&t, node, "gpu.GPU-h100"), "1/0");
}

#[test]
fn a_failed_reconfiguration_reports_what_is_there() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    apply_layout(&mut t, node, 0, "7g.40gb", false).unwrap();
    // The worker destroyed two slices and then failed.
    let mut now = gpus();
    now[0]
        .slices
        .retain(|s| s.uuid == "MIG-c" || s.uuid == "MIG-d");
    t.apply(Command::GpusChanged {
        node,
        gpus: now,
        done: Some(MigDone {
            gpu: 0,
            error: Some("Insufficient Resources".into()),
            phases: Box::new(ReconfigurationCost {
                destroyed: 2,
                destroy: Duration::from_millis(900),
                ..ReconfigurationCost::default()
            }),
        }),
    });
    assert_eq!(total(&t, node, "mig.1g.5gb"), "-");
    assert_eq!(total(&t, node, "mig.2g.10gb"), "1/0");
    let status = t.state.gpu_status();
    let gpu = &status.nodes[0].gpus[0];
    assert!(gpu.reconfiguring.is_none());
    assert_eq!(gpu.last_error.as_deref(), Some("Insufficient Resources"));
    assert_eq!(gpu.info.slices.len(), 2);
    // What it did before failing is kept beside the reason.
    let report = gpu.last_reconfiguration.as_ref().unwrap();
    assert_eq!(report.target, "7g.40gb@0");
    assert_eq!(report.error.as_deref(), Some("Insufficient Resources"));
    assert_eq!(
        (report.phases.destroyed, report.phases.destroy),
        (2, Duration::from_millis(900))
    );
}

#[test]
fn one_instance_is_created_or_destroyed_and_the_others_are_left_alone() {
    let mut t = TestState::new();
    let mut free_right = gpus();
    // 1g@0, 1g@1, 2g@2: slices 4-7 free.
    free_right[0].slices.truncate(3);
    let node = gpu_node(&mut t, free_right);
    let e = change(&mut t, node, 0, MigChange::Create("1g.5gb@2".into()), false).unwrap_err();
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Overlap), "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "cannot create 1g.5gb@2 on GPU 0 of node {node} (a100-40gb, now \
             \"1g.5gb@0,1g.5gb@1,2g.10gb@2\"): 1g.5gb@2 overlaps 2g.10gb@2"
        )),
        "{e}"
    );
    // No start: the one MIGM's reachability rule picks.
    let (plan, fx) = change(&mut t, node, 0, MigChange::Create("3g.20gb".into()), false).unwrap();
    assert_eq!(
        (plan.destroy.len(), plan.create.as_slice()),
        (0, &["3g.20gb@4".to_string()][..])
    );
    assert_eq!(plan.to, "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4");
    assert_eq!(fx, [format!("mig {node}/0 {}", plan.to)]);
    done(&mut t, node, gpus()[0].slices.clone());

    // Typed refusals, nothing changed by any of them.
    let before = format!("{:?}", t.state);
    let refused = |t: &mut TestState, c: MigChange| change(t, node, 0, c, false).unwrap_err();
    let e = refused(&mut t, MigChange::Create("2g.10gb@3".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Illegal), "{e}");
    assert!(e.to_string().contains("legal starts"), "{e}");
    let e = refused(&mut t, MigChange::Create("1g.5gb".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Illegal), "{e}");
    let e = refused(&mut t, MigChange::Destroy("1g.5gb@6".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::NoSuchInstance), "{e}");
    assert!(e.is_not_found());
    assert!(
        e.to_string().contains("has no MIG instance 1g.5gb@6"),
        "{e}"
    );
    let e = refused(&mut t, MigChange::Destroy("MIG-zz".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::NoSuchInstance), "{e}");
    let e = refused(&mut t, MigChange::Destroy("1g.5gb".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Illegal), "{e}");
    assert!(e.to_string().contains("profile@start"), "{e}");
    let e = refused(&mut t, MigChange::Destroy("2g.10gb@4".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::NoSuchInstance), "{e}");
    let (holder, _) = t.submit(task("mig.2g.10gb=1"));
    devices(&mut t, holder, &["MIG-c"]);
    let before_busy = format!("{:?}", t.state);
    let e = refused(&mut t, MigChange::Destroy("MIG-c".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Busy), "{e}");
    assert!(e.is_precondition());
    assert_eq!(format!("{:?}", t.state), before_busy);
    assert_ne!(before, before_busy, "only the submit changed the state");

    // Destroy by UUID or by placement: only that instance goes.
    let (plan, _) = change(&mut t, node, 0, MigChange::Destroy("MIG-b".into()), false).unwrap();
    assert_eq!(
        (plan.destroy.as_slice(), plan.create.len()),
        (&["1g.5gb@1".to_string()][..], 0)
    );
    assert_eq!(total(&t, node, "mig.1g.5gb"), "1/0");
    let e = refused(&mut t, MigChange::Destroy("1g.5gb@0".into()));
    assert_eq!(e.mig_refusal(), Some(MigRefusal::InProgress), "{e}");
}

#[test]
fn preparing_does_what_leaves_busy_instances_alone_and_the_switch_does_the_rest() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    // 1g@0 is serving; the next layout is a 4g (slices 0-3) and a 3g (4-7).
    let (a, _) = t.submit(task("mig.1g.5gb=1"));
    devices(&mut t, a, &["MIG-a"]);
    let target = "4g.20gb@0,3g.20gb@4";
    // Applied at once it would wait for the busy slice (and without drain, is refused).
    let e = apply_layout(&mut t, node, 0, target, false).unwrap_err();
    assert_eq!(e.mig_refusal(), Some(MigRefusal::Busy));
    // Prepared: the idle 1g@1 and 2g@2 go, the 3g@4 stays; the 4g cannot be built yet.
    let (plan, _) = change(&mut t, node, 0, MigChange::Prepare(target.into()), false).unwrap();
    assert_eq!(plan.destroy, ["1g.5gb@1", "2g.10gb@2"]);
    assert!(plan.create.is_empty(), "{plan:?}");
    assert_eq!(plan.to, "1g.5gb@0,3g.20gb@4");
    assert!(plan.waiting_for.is_empty(), "the busy slice is not touched");
    assert_eq!(
        total(&t, node, "mig.1g.5gb"),
        "1/1",
        "the busy one keeps serving"
    );
    done(
        &mut t,
        node,
        vec![
            slice("1g.5gb", 0, 1, "MIG-a"),
            slice("3g.20gb", 4, 4, "MIG-d"),
        ],
    );
    // Once the busy task ends, the switch does only what is left: one destroy, one create.
    t.exit(a, 0);
    let (plan, _) = apply_layout(&mut t, node, 0, target, false).unwrap();
    assert_eq!(
        (plan.destroy.as_slice(), plan.create.as_slice()),
        (
            &["1g.5gb@0".to_string()][..],
            &["4g.20gb@0".to_string()][..]
        )
    );
    assert_eq!(plan.estimated, Duration::from_millis(500 + 5500));
}

#[test]
fn preparing_creates_what_fits_among_idle_slices_while_busy_ones_serve() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    // The 3g@4 serves; the idle 1g@0, 1g@1 and 2g@2 become a 4g@0 ahead of the switch.
    let (a, _) = t.submit(task("mig.3g.20gb=1"));
    devices(&mut t, a, &["MIG-d"]);
    let (plan, _) = change(
        &mut t,
        node,
        0,
        MigChange::Prepare("4g.20gb@0,2g.10gb@4,1g.5gb@6".into()),
        false,
    )
    .unwrap();
    assert_eq!(plan.to, "4g.20gb@0,3g.20gb@4");
    assert_eq!(plan.create, ["4g.20gb@0"]);
    assert_eq!(plan.destroy.len(), 3);
    // The model's cost of the prepared part is off the switch's path: what is left after
    // it is the 3g's replacement alone.
    let full = escher_proto::mig::LatencyModel::default();
    let layout = |s: &str| escher_proto::mig::Layout::parse(GpuModel::A100_40GB, s).unwrap();
    let whole = full.reconfiguration_time(
        &layout("1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4"),
        &layout("4g.20gb@0,2g.10gb@4,1g.5gb@6"),
    );
    let rest = full.reconfiguration_time(
        &layout("4g.20gb@0,3g.20gb@4"),
        &layout("4g.20gb@0,2g.10gb@4,1g.5gb@6"),
    );
    assert!(rest < whole, "{rest:?} < {whole:?}");
    // Preparing an already prepared layout changes nothing.
    done(
        &mut t,
        node,
        vec![
            slice("4g.20gb", 0, 4, "MIG-p"),
            slice("3g.20gb", 4, 4, "MIG-d"),
        ],
    );
    let (plan, fx) = change(
        &mut t,
        node,
        0,
        MigChange::Prepare("4g.20gb@0,2g.10gb@4,1g.5gb@6".into()),
        false,
    )
    .unwrap();
    assert!(plan.is_unchanged() && fx.is_empty(), "{plan:?}");
}

#[test]
fn draining_and_lost_nodes_are_left_alone() {
    let mut t = TestState::new();
    let node = gpu_node(&mut t, gpus());
    t.apply(Command::DrainNode { node });
    let e = apply_layout(&mut t, node, 0, "7g.40gb", false).unwrap_err();
    assert!(e.to_string().contains("is draining"), "{e}");
    // A report from a draining node does not bring its resources back.
    t.apply(Command::GpusChanged {
        node,
        gpus: gpus(),
        done: None,
    });
    assert_eq!(total(&t, node, "mig.1g.5gb"), "-");
    t.remove_node(node);
    let e = apply_layout(&mut t, node, 0, "7g.40gb", false).unwrap_err();
    assert!(e.to_string().contains("is not live"), "{e}");
}

#[test]
fn the_same_commands_give_the_same_state() {
    let run = || {
        let mut t = TestState::new();
        let node = gpu_node(&mut t, gpus());
        let (a, _) = t.submit(task("mig.1g.5gb=1"));
        devices(&mut t, a, &["MIG-b"]);
        apply_layout(&mut t, node, 0, "4g.20gb,3g.20gb", true).unwrap();
        t.exit(a, 0);
        format!("{:?}", t.state)
    };
    assert_eq!(run(), run());
}
