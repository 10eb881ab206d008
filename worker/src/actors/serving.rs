//! The built-in actor class [`SERVING_REPLICA_CLASS`]: one replica of an inference service,
//! holding the GPU slice it was placed on for as long as it lives.
//!
//! The GPU policies' inference servers (MIGRator's and OLTunes' replicas, Ekya's inference
//! side) run as actors of this class in the end-to-end GPU workload (`escher-gpu`'s
//! `ClusterGpu`): the replica is created on the MIG slice a policy binds to it (the slice's
//! resources are the actor's), it is drained before its slice is destroyed (the driver stops
//! sending it requests, has it report what it served, then kills it), and a resize recreates
//! it on the new slice. The requests themselves are the simulated part of serving (the
//! driver's model of rates and SLOs, `escher-gpu`'s `Serving`): the actor is told, call by
//! call, how many requests it served, and keeps the count. OLTunes' servers (`escher-gpu`'s
//! `oltunes::OlTunesCluster`) hold a share of a whole GPU instead of a slice
//! (`gpu.<uuid>=0.25`, its device given to it all the same), one replica per OLTunes task.
//!
//! Methods (arguments and results in [`escher_proto::codec`]):
//! - `serve(count: f64) -> f64`: `count` more requests served (finite, not negative); the
//!   replica's total so far;
//! - `info(()) -> ReplicaInfo`: the service it serves, the devices it holds and its total.
//!
//! Its constructor takes the service's task id (`u64`) and refuses to start without a GPU
//! device: a replica holds a slice (`mig.<profile>=1`, or a whole GPU).

pub use escher_proto::types::{ReplicaInfo, SERVING_REPLICA_CLASS};

use super::ActorClass;

struct Replica {
    info: ReplicaInfo,
}

/// The class, registered by every worker.
pub(crate) fn class() -> ActorClass {
    ActorClass::new(SERVING_REPLICA_CLASS, |ctx, service: u64| async move {
        let devices = ctx.visible_devices().to_vec();
        if devices.is_empty() {
            return Err(format!(
                "a serving replica holds a GPU slice, and this actor was given none: ask for \
                 one (`mig.<profile>=1`, or `gpu=1`) in its resources (service {service})"
            ));
        }
        Ok(Replica {
            info: ReplicaInfo {
                service,
                devices,
                served: 0.0,
            },
        })
    })
    .method("serve", |r: &mut Replica, count: f64| {
        if !count.is_finite() || count < 0.0 {
            return Err(format!(
                "serve takes a finite count of requests, not negative: {count}"
            ));
        }
        r.info.served += count;
        Ok(r.info.served)
    })
    .method("info", |r: &mut Replica, (): ()| Ok(r.info.clone()))
}
