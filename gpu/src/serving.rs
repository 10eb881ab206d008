//! [`Serving`]: how inference replicas serve requests, shared by the in-memory
//! [`SimGpu`](super::SimGpu) and a cluster's GPU ([`ClusterGpu`](super::ClusterGpu)), so that
//! a policy's requests are counted the same way on both.
//!
//! An inference service has replicas, each one MIG instance bound to it. Requests arrive for
//! the service and go to the replicas that serve, each request to the one whose queue for its
//! size is the shortest, as a dispatcher deciding per request does: a batch that arrives at
//! once is spread so that every replica's queue takes the same time to serve
//! (`spread`), not sent whole to one (a driver hands requests over once per round, and a
//! 1-GPC replica given a round's requests of a 5-GPC tenant would shed most of them). A
//! replica still loading its model takes none (a load balancer routes only to replicas that
//! are ready); while a service has no replica that serves, its requests wait in its backlog,
//! which the first ones that serve take. A replica serves its queue first
//! come first served, `per_gpc_rps` requests per second per GPC of its instance, once it is
//! ready (`serving_from`); a request still waiting when its SLO has passed is shed, as a
//! serving system with deadlines does, so a burst does not make every later request late. A
//! draining replica takes nothing new and is done when its queue is empty, so no request is
//! lost to a reconfiguration (drain before destroy).
//!
//! This is the simulated part of serving (a model of requests and latency, named as such):
//! which instances exist, when they are ready and when they go are the GPU's.

use std::collections::{BTreeMap, VecDeque};

use escher_proto::mig::{InferenceModel, Placement};
use escher_proto::types::TaskId;

/// Requests of one service, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServiceStats {
    /// Requests that arrived.
    pub arrived: f64,
    /// Requests served.
    pub served: f64,
    /// Requests served within the SLO.
    pub on_time: f64,
    /// Requests shed because they waited past the SLO.
    pub expired: f64,
}

#[derive(Debug, Clone)]
struct Service {
    model: InferenceModel,
    stats: ServiceStats,
    /// Requests waiting for a replica: (arrival ms, count).
    backlog: VecDeque<(u64, f64)>,
}

#[derive(Debug, Clone)]
struct Replica {
    placement: Placement,
    service: TaskId,
    /// Its queue: (arrival ms, count).
    queue: VecDeque<(u64, f64)>,
    /// It serves from this time (ms) on: once its model is loaded.
    serving_from: u64,
    draining: bool,
    /// Requests it served.
    served: f64,
}

impl Replica {
    /// Whether it takes new requests of `task` at `now`: its own, not draining, serving.
    fn takes(&self, task: TaskId, now: u64) -> bool {
        self.service == task && !self.draining && now >= self.serving_from
    }

    /// Requests in its queue.
    fn queued(&self) -> f64 {
        self.queue.iter().map(|q| q.1).sum()
    }
}

/// `count` requests arrived at `at` spread over `replicas` (one service's, all serving) as a
/// dispatcher sending each to the replica whose queue for its size is the shortest would:
/// the emptiest fill first, until every replica that takes some has the same queue per GPC.
fn spread(replicas: &mut [&mut Replica], at: u64, count: f64) {
    let gpcs = |r: &Replica| f64::from(r.placement.profile.compute.max(1));
    replicas.sort_by(|a, b| (a.queued() / gpcs(a)).total_cmp(&(b.queued() / gpcs(b))));
    // The level (queue per GPC) the first `j` replicas reach together.
    let (mut queued, mut size, mut level) = (0.0, 0.0, 0.0);
    let mut j = 0;
    while j < replicas.len() {
        queued += replicas[j].queued();
        size += gpcs(replicas[j]);
        level = (count + queued) / size;
        j += 1;
        if replicas
            .get(j)
            .is_none_or(|next| level <= next.queued() / gpcs(next))
        {
            break;
        }
    }
    for r in replicas.iter_mut().take(j) {
        let share = level * gpcs(r) - r.queued();
        if share > 1e-12 {
            r.queue.push_back((at, share));
        }
    }
}

/// The inference services of one GPU and their replicas (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Serving {
    services: BTreeMap<TaskId, Service>,
    /// By the instance's start.
    replicas: BTreeMap<u8, Replica>,
}

impl Serving {
    /// Declares inference service `task`.
    pub fn add(&mut self, task: TaskId, model: InferenceModel) {
        self.services.insert(
            task,
            Service {
                model,
                stats: ServiceStats::default(),
                backlog: VecDeque::new(),
            },
        );
    }

    /// Whether `task` is a service declared here.
    pub fn is_service(&self, task: TaskId) -> bool {
        self.services.contains_key(&task)
    }

    /// `count` requests for service `task` arrive at `now` (ms); they go to the replica with
    /// the shortest queue for its size, or wait until the service has one. Nothing for an
    /// unknown service.
    pub fn arrive(&mut self, task: TaskId, count: f64, now: u64) {
        let Some(service) = self.services.get_mut(&task) else {
            return;
        };
        service.stats.arrived += count;
        let mut ready: Vec<&mut Replica> = self
            .replicas
            .values_mut()
            .filter(|r| r.takes(task, now))
            .collect();
        if ready.is_empty() {
            service.backlog.push_back((now, count));
        } else {
            spread(&mut ready, now, count);
        }
    }

    /// Instance `on` becomes a replica of service `task`, serving from `serving_from` (ms).
    pub fn bind(&mut self, task: TaskId, on: Placement, serving_from: u64) {
        self.replicas.insert(
            on.start,
            Replica {
                placement: on,
                service: task,
                queue: VecDeque::new(),
                serving_from,
                draining: false,
                served: 0.0,
            },
        );
    }

    /// The replica on `on` serves from `from` (ms) on (its model is loaded, its task runs).
    pub fn start(&mut self, on: Placement, from: u64) {
        if let Some(r) = self
            .replicas
            .get_mut(&on.start)
            .filter(|r| r.placement == on)
        {
            r.serving_from = from;
        }
    }

    /// The replica on `on` takes no new requests; it is done once its queue is (see
    /// [`Serving::serve`]). `false` if `on` is no replica.
    pub fn drain(&mut self, on: Placement) -> bool {
        match self.replicas.get_mut(&on.start) {
            Some(r) if r.placement == on => {
                r.draining = true;
                true
            }
            _ => false,
        }
    }

    /// The replica on `on` is gone at once (its instance lost): what it held is shed.
    pub fn remove(&mut self, on: Placement) {
        if let Some(r) = self.replicas.remove(&on.start)
            && let Some(service) = self.services.get_mut(&r.service)
        {
            service.stats.expired += r.queue.iter().map(|q| q.1).sum::<f64>();
        }
    }

    /// The service instance `on` serves, if it is a replica.
    pub fn service_of(&self, on: Placement) -> Option<TaskId> {
        self.replicas
            .get(&on.start)
            .filter(|r| r.placement == on)
            .map(|r| r.service)
    }

    /// Requests the replica on `on` served, if it is a replica.
    pub fn served_on(&self, on: Placement) -> Option<f64> {
        self.replicas
            .get(&on.start)
            .filter(|r| r.placement == on)
            .map(|r| r.served)
    }

    /// Serves `dt` seconds ending at `now` (ms): replicas take the backlog, shed what is past
    /// its SLO and serve their queues. Returns the draining replicas that ran dry (they are no
    /// replicas any more), each with the requests it served in all.
    pub fn serve(&mut self, now: u64, dt: f64) -> Vec<(Placement, f64)> {
        for (task, service) in &mut self.services {
            if service.backlog.is_empty() {
                continue;
            }
            let mut ready: Vec<&mut Replica> = self
                .replicas
                .values_mut()
                .filter(|r| r.takes(*task, now))
                .collect();
            if ready.is_empty() {
                continue;
            }
            for (at, count) in service.backlog.drain(..) {
                spread(&mut ready, at, count);
            }
        }
        let mut drained = Vec::new();
        for replica in self.replicas.values_mut() {
            let Some(service) = self.services.get_mut(&replica.service) else {
                continue;
            };
            let slo = service.model.slo_ms;
            while let Some(front) = replica.queue.front() {
                if now.saturating_sub(front.0) <= slo {
                    break;
                }
                service.stats.expired += front.1;
                replica.queue.pop_front();
            }
            if now >= replica.serving_from {
                let mut budget =
                    service.model.per_gpc_rps * f64::from(replica.placement.profile.compute) * dt;
                while budget > 1e-12 {
                    let Some(front) = replica.queue.front_mut() else {
                        break;
                    };
                    let n = front.1.min(budget);
                    front.1 -= n;
                    budget -= n;
                    service.stats.served += n;
                    replica.served += n;
                    if now.saturating_sub(front.0) <= slo {
                        service.stats.on_time += n;
                    }
                    if front.1 <= 1e-12 {
                        replica.queue.pop_front();
                    }
                }
            }
            if replica.draining && replica.queue.is_empty() {
                drained.push((replica.placement, replica.served));
            }
        }
        for (p, _) in &drained {
            self.replicas.remove(&p.start);
        }
        drained
    }

    /// Requests of service `task` waiting, in its backlog or in a replica's queue.
    pub fn queued(&self, task: TaskId) -> f64 {
        let backlog: f64 = self
            .services
            .get(&task)
            .map(|s| s.backlog.iter().map(|q| q.1).sum())
            .unwrap_or(0.0);
        let queues: f64 = self
            .replicas
            .values()
            .filter(|r| r.service == task)
            .map(|r| r.queue.iter().map(|q| q.1).sum::<f64>())
            .sum();
        backlog + queues
    }

    /// Service `task`'s counts.
    pub fn stats(&self, task: TaskId) -> Option<ServiceStats> {
        self.services.get(&task).map(|s| s.stats)
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::mig::GpuModel;

    use super::*;

    fn placement(text: &str) -> Placement {
        Placement::parse(GpuModel::A100_40GB, text).unwrap()
    }

    fn service() -> (Serving, TaskId) {
        let mut s = Serving::default();
        let task = TaskId(1);
        s.add(
            task,
            InferenceModel {
                per_gpc_rps: 10.0,
                slo_ms: 1000,
            },
        );
        (s, task)
    }

    #[test]
    fn requests_wait_for_a_replica_then_are_served_by_size() {
        let (mut s, task) = service();
        s.arrive(task, 30.0, 0);
        assert_eq!(s.queued(task), 30.0);
        // A 3g replica serves 30 requests a second, from its load's end on.
        s.bind(task, placement("3g.20gb@4"), u64::MAX);
        s.start(placement("3g.20gb@4"), 500);
        assert!(s.serve(250, 0.25).is_empty());
        assert_eq!(s.stats(task).unwrap().served, 0.0, "not loaded yet");
        s.serve(750, 0.5);
        let st = s.stats(task).unwrap();
        assert!(
            (st.served - 15.0).abs() < 1e-9 && st.on_time == st.served,
            "{st:?}"
        );
        // The rest wait past the SLO and are shed, not served late.
        s.serve(1250, 0.5);
        let st = s.stats(task).unwrap();
        assert!((st.served + st.expired - 30.0).abs() < 1e-9, "{st:?}");
        assert_eq!(s.queued(task), 0.0);
        // Unknown services are ignored.
        s.arrive(TaskId(9), 5.0, 0);
        assert!(s.stats(TaskId(9)).is_none());
    }

    #[test]
    fn a_draining_replica_takes_nothing_new_and_finishes_what_it_holds() {
        let (mut s, task) = service();
        let (one, two) = (placement("1g.5gb@0"), placement("2g.10gb@2"));
        s.bind(task, one, 0);
        s.bind(task, two, 0);
        // 30 requests: the emptier queue for its size takes each batch.
        for _ in 0..3 {
            s.arrive(task, 10.0, 0);
        }
        assert!(s.drain(one));
        assert!(!s.drain(placement("1g.5gb@6")));
        s.arrive(task, 10.0, 0);
        let mut drained = Vec::new();
        for i in 1..=5 {
            drained.extend(s.serve(i * 200, 0.2));
        }
        assert_eq!(
            drained.len(),
            1,
            "drained once its queue ran dry: {drained:?}"
        );
        assert_eq!(drained[0].0, one);
        assert_eq!(s.service_of(one), None);
        assert_eq!(s.service_of(two), Some(task));
        let st = s.stats(task).unwrap();
        assert!((st.served + st.expired + s.queued(task) - st.arrived).abs() < 1e-9);
        // What each replica served adds up to the service's.
        let by_replicas = drained[0].1 + s.served_on(two).unwrap();
        assert!(drained[0].1 > 0.0, "{drained:?}");
        assert!(
            (by_replicas - st.served).abs() < 1e-9,
            "{by_replicas} {st:?}"
        );
        // A replica lost at once sheds what it held.
        s.arrive(task, 4.0, 1000);
        s.remove(two);
        let st = s.stats(task).unwrap();
        assert!((st.served + st.expired - st.arrived).abs() < 1e-9, "{st:?}");
    }

    #[test]
    fn a_batch_is_spread_over_the_replicas_by_size_not_sent_whole_to_one() {
        // A 4g and a 1g serve 40 and 10 requests a second. 50 arriving at once (one round's
        // worth) go 40 and 10, so each replica's share takes 1 s and all are on time; sent
        // whole to the 4g (the emptier queue for its size when the batch came), 10 would wait
        // past the 1 s SLO.
        let (mut s, task) = service();
        let (four, one) = (placement("4g.20gb@0"), placement("1g.5gb@4"));
        s.bind(task, four, 0);
        s.bind(task, one, 0);
        s.arrive(task, 50.0, 0);
        s.serve(1000, 1.0);
        let st = s.stats(task).unwrap();
        assert!((st.on_time - 50.0).abs() < 1e-9, "{st:?}");
        // 10 more go 8 and 2. With the 1g's 2 gone and 8 queued on the 4g (0.2 s of work),
        // the next 20 go 14.4 and 5.6: both queues then take 0.56 s.
        s.arrive(task, 10.0, 1000);
        let q = |s: &Serving, p: Placement| s.replicas[&p.start].queued();
        assert!((q(&s, four) - 8.0).abs() < 1e-9 && (q(&s, one) - 2.0).abs() < 1e-9);
        s.replicas.get_mut(&one.start).unwrap().queue.clear();
        s.arrive(task, 20.0, 1000);
        assert!((q(&s, four) - 22.4).abs() < 1e-9 && (q(&s, one) - 5.6).abs() < 1e-9);
    }

    #[test]
    fn a_replica_still_loading_takes_no_requests_while_another_serves() {
        // The 1g at 0 is bound but loads its model until 5 s; the 2g at 4 serves. Requests go
        // to the 2g and are served on time, not queued on the 1g to wait past their SLO.
        let (mut s, task) = service();
        let (loading, ready) = (placement("1g.5gb@0"), placement("2g.10gb@4"));
        s.bind(task, loading, 5000);
        s.bind(task, ready, 0);
        s.arrive(task, 10.0, 0);
        s.serve(1000, 1.0);
        let st = s.stats(task).unwrap();
        assert!((st.on_time - 10.0).abs() < 1e-9, "{st:?}");
        assert_eq!(st.expired, 0.0);
        // With no replica serving, requests wait in the backlog for the first that does.
        s.drain(ready);
        s.serve(1100, 0.1);
        s.arrive(task, 5.0, 4500);
        s.serve(5000, 0.5);
        s.serve(5500, 0.5);
        let st = s.stats(task).unwrap();
        assert!((st.on_time - 15.0).abs() < 1e-9, "{st:?}");
    }
}
