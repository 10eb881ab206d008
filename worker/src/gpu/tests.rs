//! Tests of the device allocator and of [`Gpus`]: binding (never beyond capacity, fractional
//! sharing, MIG UUIDs, pins, waiting), and the life of a reconfiguration.

use std::collections::BTreeSet;

use escher_proto::mig::{GpuModel, Layout};
use escher_proto::types::{GpuInfo, gpu_identity, mig_identity};
use escher_proto::{Amount, ResourceSet};
use proptest::prelude::*;

use super::allocator::{BindError, DeviceAllocator};
use super::sim::{SimGpuSpec, gpu_info};
use super::{GpuSources, Gpus, discover, scaled_latency};

fn set(s: &str) -> ResourceSet {
    s.parse().unwrap()
}

fn sim(specs: &[&str]) -> Vec<GpuInfo> {
    let specs: Vec<SimGpuSpec> = specs.iter().map(|s| s.parse().unwrap()).collect();
    discover(GpuSources {
        nvml: false,
        simulated: &specs,
        worker: "w",
        sim_state: None,
    })
}

fn uuids(holds: &[escher_proto::types::DeviceHold]) -> Vec<String> {
    holds.iter().map(|h| h.uuid.clone()).collect()
}

#[test]
fn mig_tasks_each_get_their_own_slice() {
    let gpus = sim(&["a100-40gb:mig=1g.5gb,1g.5gb,1g.5gb,4g.20gb"]);
    let mut alloc = DeviceAllocator::new(&gpus);
    let mut seen = BTreeSet::new();
    for holder in 0..3 {
        let holds = alloc.bind(holder, &set("cpu=1,mig.1g.5gb=1")).unwrap();
        assert_eq!(holds.len(), 1);
        assert!(holds[0].uuid.starts_with("MIG-"));
        assert_eq!(holds[0].amount, Amount::ONE);
        assert!(seen.insert(holds[0].uuid.clone()), "a slice given twice");
        alloc.sanity_check().unwrap();
    }
    assert!(matches!(
        alloc.bind(3, &set("mig.1g.5gb=1")),
        Err(BindError::Wait(_))
    ));
    let big = alloc.bind(4, &set("mig.4g.20gb=1")).unwrap();
    assert!(!seen.contains(&big[0].uuid));
    assert!(alloc.release(1));
    assert!(!alloc.release(1));
    let again = alloc.bind(3, &set("mig.1g.5gb=1")).unwrap();
    assert!(seen.contains(&again[0].uuid));
    alloc.sanity_check().unwrap();
    // More slices of a profile than the node has can never be bound here.
    assert!(matches!(
        alloc.bind(9, &set("mig.1g.5gb=4")),
        Err(BindError::Never(_))
    ));
    assert!(matches!(
        alloc.bind(9, &set("mig.2g.10gb=1")),
        Err(BindError::Never(_))
    ));
}

#[test]
fn fractions_share_one_gpu_until_it_is_full() {
    let gpus = sim(&["h100-80gb", "h100-80gb"]);
    let mut alloc = DeviceAllocator::new(&gpus);
    let a = alloc.bind(1, &set("gpu=0.5")).unwrap();
    let b = alloc.bind(2, &set("gpu=0.5")).unwrap();
    assert_eq!(uuids(&a), uuids(&b), "two halves pack onto one GPU");
    assert_eq!(a[0].uuid, gpus[0].uuid);
    let c = alloc.bind(3, &set("gpu=0.25")).unwrap();
    assert_eq!(c[0].uuid, gpus[1].uuid, "the first GPU is full");
    let d = alloc.bind(4, &set("gpu=0.5")).unwrap();
    assert_eq!(d[0].uuid, gpus[1].uuid);
    // 0.25 is left on GPU 1: a whole GPU must wait, a quarter fits.
    assert!(matches!(
        alloc.bind(5, &set("gpu=1")),
        Err(BindError::Wait(_))
    ));
    assert_eq!(
        alloc.bind(6, &set("gpu=0.25")).unwrap()[0].uuid,
        gpus[1].uuid
    );
    alloc.sanity_check().unwrap();
    // Fragmentation: 0.5 free on each GPU is 1 in all, but no single GPU has 0.75.
    alloc.release(1);
    alloc.release(6);
    assert!(matches!(
        alloc.bind(7, &set("gpu=0.75")),
        Err(BindError::Wait(_))
    ));
    alloc.sanity_check().unwrap();
}

#[test]
fn whole_and_mixed_amounts() {
    let gpus = sim(&["h100-80gb", "h100-80gb", "h100-80gb"]);
    let mut alloc = DeviceAllocator::new(&gpus);
    let two = alloc.bind(1, &set("gpu=2")).unwrap();
    assert_eq!(uuids(&two), [gpus[0].uuid.clone(), gpus[1].uuid.clone()]);
    let half = alloc.bind(2, &set("gpu=0.5")).unwrap();
    assert_eq!(half[0].uuid, gpus[2].uuid);
    alloc.release(1);
    // 1.5: one whole GPU and half of another, packed next to the half already there.
    let mixed = alloc.bind(3, &set("gpu=1.5")).unwrap();
    assert_eq!(mixed.len(), 2);
    assert_eq!(
        (mixed[0].amount, mixed[1].amount),
        (Amount::ONE, "0.5".parse().unwrap())
    );
    assert_eq!(mixed[1].uuid, gpus[2].uuid);
    assert!(matches!(
        alloc.bind(4, &set("gpu=4")),
        Err(BindError::Never(_))
    ));
    alloc.sanity_check().unwrap();
    // A holder bound twice keeps what it has; one with no GPU resources gets nothing.
    assert_eq!(alloc.bind(3, &set("gpu=1.5")).unwrap(), mixed);
    assert!(alloc.bind(5, &set("cpu=4,my-res=1")).unwrap().is_empty());
}

#[test]
fn identities_pin_one_device() {
    let gpus = sim(&["h100-80gb", "h100-80gb", "a100-40gb:mig=1g.5gb,1g.5gb"]);
    let mut alloc = DeviceAllocator::new(&gpus);
    let second = gpu_identity(&gpus[1].uuid).unwrap();
    let pinned = alloc.bind(1, &set(&format!("gpu=1,{second}=1"))).unwrap();
    assert_eq!(uuids(&pinned), [gpus[1].uuid.clone()]);
    // The class amount beyond the pin goes to another device.
    let third = gpu_identity(&gpus[0].uuid).unwrap();
    let slice = &gpus[2].slices[1];
    let slice_id = mig_identity(&slice.uuid).unwrap();
    let both = alloc
        .bind(2, &set(&format!("mig.1g.5gb=1,{slice_id}=1,{third}=0.5")))
        .unwrap();
    assert_eq!(uuids(&both), [gpus[0].uuid.clone(), slice.uuid.clone()]);
    // A pinned device that is busy: wait; one that does not exist here: never.
    assert!(matches!(
        alloc.bind(3, &set(&format!("gpu=1,{second}=1"))),
        Err(BindError::Wait(_))
    ));
    assert!(matches!(
        alloc.bind(3, &set("gpu=1,gpu.GPU-nowhere=1")),
        Err(BindError::Never(_))
    ));
    alloc.sanity_check().unwrap();
}

#[test]
fn retiring_devices_take_nothing_new() {
    let gpus = sim(&["a100-40gb:mig=1g.5gb,1g.5gb"]);
    let mut alloc = DeviceAllocator::new(&gpus);
    let first = alloc.bind(1, &set("mig.1g.5gb=1")).unwrap();
    let retiring = BTreeSet::from([first[0].uuid.clone(), gpus[0].slices[1].uuid.clone()]);
    alloc.set_retiring(&retiring, true);
    assert!(!alloc.all_free(&retiring));
    assert!(matches!(
        alloc.bind(2, &set("mig.1g.5gb=1")),
        Err(BindError::Never(_))
    ));
    alloc.release(1);
    assert!(alloc.all_free(&retiring));
}

#[derive(Debug, Clone)]
enum Op {
    Bind(u64, ResourceSet),
    Release(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let amount = prop_oneof![
        Just("0.25"),
        Just("0.5"),
        Just("0.3"),
        Just("1"),
        Just("2"),
        Just("1.5")
    ];
    let class = prop_oneof![Just("gpu"), Just("mig.1g.5gb"), Just("mig.3g.20gb")];
    prop_oneof![
        (0..12u64, class, amount).prop_map(|(h, c, a)| Op::Bind(h, set(&format!("{c}={a}")))),
        (0..12u64).prop_map(Op::Release),
    ]
}

proptest! {
    /// Whatever is bound and released, in any order, no device is ever held beyond its
    /// capacity, and a release gives back exactly what was bound.
    #[test]
    fn never_beyond_capacity(ops in proptest::collection::vec(op(), 1..60)) {
        let gpus = sim(&["h100-80gb", "h100-80gb", "a100-40gb:mig=3g.20gb,1g.5gb,1g.5gb,1g.5gb"]);
        let mut alloc = DeviceAllocator::new(&gpus);
        let mut bound = std::collections::BTreeMap::new();
        for op in ops {
            match op {
                Op::Bind(h, r) => {
                    let fresh = !bound.contains_key(&h);
                    if let Ok(holds) = alloc.bind(h, &r) {
                        let total = holds
                            .iter()
                            .try_fold(Amount::ZERO, |a, h| a.checked_add(h.amount))
                            .unwrap();
                        if fresh {
                            // A fresh bind gives exactly the amount asked for.
                            let asked = r.iter().next().map(|(_, a)| a).unwrap();
                            prop_assert_eq!(total, asked);
                            bound.insert(h, total);
                        }
                    }
                }
                Op::Release(h) => {
                    prop_assert_eq!(alloc.release(h), bound.remove(&h).is_some());
                }
            }
            prop_assert!(alloc.sanity_check().is_ok(), "{:?}", alloc.sanity_check());
        }
    }
}

#[test]
fn a_reconfiguration_waits_for_its_slices_then_replaces_them() {
    let specs: Vec<SimGpuSpec> = vec!["a100-40gb:mig=1g.5gb@0,1g.5gb@1,2g.10gb@2".parse().unwrap()];
    let gpus = discover(GpuSources {
        nvml: false,
        simulated: &specs,
        worker: "w",
        sim_state: None,
    });
    let mut g = Gpus::new("w", gpus, scaled_latency(0.0), None);
    assert_eq!(
        g.resources()
            .to_string()
            .split(',')
            .take(2)
            .collect::<Vec<_>>(),
        ["mig.1g.5gb=2", "mig.2g.10gb=1"]
    );
    let held = g.bind(1, &set("mig.1g.5gb=1")).unwrap();
    assert_eq!(held[0].uuid, g.inventory()[0].slices[0].uuid);
    // Keep 1g.5gb@0 (held), replace 1g.5gb@1 and the 2g by a 3g.20gb at 4: the held slice
    // stays, so the change waits for nothing.
    g.request(0, "1g.5gb@0,3g.20gb@4").unwrap();
    assert!(g.request(0, "7g.40gb").unwrap_err().contains("already"));
    assert!(!g.resources().to_string().contains("mig.2g.10gb"));
    let jobs = g.take_ready();
    assert_eq!(jobs.len(), 1);
    assert!(g.take_ready().is_empty(), "a job starts once");
    let reconfigured = tokio_test_block_on(jobs.into_iter().next().unwrap().run());
    assert_eq!(reconfigured.error, None);
    // Modelled phase by phase (at the test's scale): two destroyed, one created.
    let cost = reconfigured.cost;
    assert_eq!((cost.destroyed, cost.created), (2, 1));
    let a100 = |text: &str| Layout::parse(GpuModel::A100_40GB, text).unwrap();
    assert_eq!(
        cost,
        scaled_latency(0.0).cost(
            &a100("1g.5gb@0,1g.5gb@1,2g.10gb@2"),
            &a100("1g.5gb@0,3g.20gb@4")
        )
    );
    let done = g.finish(reconfigured);
    assert_eq!((done.gpu, &done.error, *done.phases), (0, &None, cost));
    let layout = g.inventory()[0].layout().unwrap().unwrap();
    assert_eq!(layout.to_string(), "1g.5gb@0,3g.20gb@4");
    assert_eq!(
        g.resources()
            .iter()
            .filter(|(n, _)| !n.as_str().starts_with("mig.MIG"))
            .map(|(n, a)| format!("{n}={a}"))
            .collect::<Vec<_>>(),
        ["mig.1g.5gb=1", "mig.3g.20gb=1"]
    );
    // The kept slice is still held by the same task; the new one is free.
    assert!(g.release(1));
    let new = g.bind(2, &set("mig.3g.20gb=1")).unwrap();
    assert_eq!(new[0].uuid, g.inventory()[0].slices[1].uuid);

    // A change that destroys a held slice waits for it.
    let _held = g.bind(3, &set("mig.1g.5gb=1")).unwrap();
    g.request(0, "7g.40gb").unwrap();
    assert!(g.take_ready().is_empty());
    g.release(3);
    assert!(g.take_ready().is_empty(), "the 3g slice is still held");
    g.release(2);
    assert_eq!(g.take_ready().len(), 1);
}

#[test]
fn bad_requests_are_refused() {
    let gpus = sim(&["h100-80gb", "a100-40gb:mig="]);
    let mut g = Gpus::new("w", gpus, scaled_latency(0.0), None);
    assert!(
        g.request(0, "7g.80gb")
            .unwrap_err()
            .contains("not a MIG GPU in MIG mode")
    );
    assert!(g.request(5, "7g.40gb").unwrap_err().contains("no GPU 5"));
    assert!(
        g.request(1, "2g.20gb")
            .unwrap_err()
            .contains("no MIG profile")
    );
    assert!(g.inventory()[1].slices.is_empty());
    assert_eq!(g.inventory()[1].model, Some(GpuModel::A100_40GB));
}

#[test]
fn no_gpus_bind_nothing_and_hide_nothing() {
    let mut g = Gpus::new("w", Vec::new(), scaled_latency(0.0), None);
    assert!(g.bind(1, &set("gpu=1")).unwrap().is_empty());
    assert_eq!(g.visible(&[]), None);
    let g = Gpus::new(
        "w",
        vec![gpu_info("w", 0, &"h100-80gb".parse().unwrap())],
        scaled_latency(0.0),
        None,
    );
    assert_eq!(g.visible(&[]), Some(vec![]));
    let metrics: Vec<String> = g.metrics().into_iter().map(|m| m.name).collect();
    assert_eq!(metrics, ["gpu.0.utilization", "gpu.0.memory_used_mib"]);
}

/// Runs a future to completion on a fresh current-thread runtime (tokio's test macro needs a
/// runtime per test; this keeps the plain tests plain).
fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}
