//! A test environment for the head's state machine: builders for task specs and resource
//! updates, a clock, a compact rendering of effects for exact assertions, and the invariant
//! checks run after every step.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub mod ops;

use escher_core::state::{
    ApplyError, ClusterState, Command, Effect, Entry, Joining, Recorded, Reply, Returning,
    SecretHash, StateConfig,
};
use escher_proto::types::{
    Capacity, CapacityOp, ClusterStatus, DATA_ADDRESS_LABEL, Labels, NAMESPACE_LABEL, Namespace,
    NodeId, NodeSpec, ObjectId, ResourceName, ResourceSet, ResourceStatus, ResourceUpdate,
    SealedCopy, TaskFinished, TaskId, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus,
};

/// The time the test clock starts at (milliseconds since the epoch, arbitrary).
pub const T0: u64 = 1_700_000_000_000;
/// The id of the cluster every test state is.
pub const CLUSTER: &str = "test-cluster";

/// A worker joining with these resources, from process boot `boot`.
pub fn joining(node_name: &str, resources: &str, boot: u64) -> Joining {
    Joining {
        name: node_name.to_string(),
        address: format!("{node_name}.example:7601"),
        resources: res(resources),
        labels: Labels::new(),
        gpus: Vec::new(),
        boot,
    }
}

/// The secret the test gives the worker named `node_name`.
pub fn secret(node_name: &str) -> SecretHash {
    SecretHash::of(&format!("secret of {node_name}"))
}

/// Registers a node named `name` whose worker publishes a data-plane address (an object
/// holder), and returns its id.
pub fn data_node(t: &mut TestState, name: &str) -> NodeId {
    let mut worker = joining(name, "cpu=4", 1);
    worker
        .labels
        .insert(DATA_ADDRESS_LABEL, &format!("{name}.example:7700"))
        .unwrap();
    match t
        .apply(Command::RegisterNode {
            worker,
            secret: secret(name),
        })
        .reply
    {
        Reply::Registered(id) => id,
        other => panic!("RegisterNode replied {other:?}"),
    }
}

/// A new node's registration.
pub fn register_command(node_name: &str, resources: &str) -> Command {
    Command::RegisterNode {
        worker: joining(node_name, resources, 1),
        secret: secret(node_name),
    }
}

/// The state under test plus a clock.
#[derive(Debug)]
pub struct TestState {
    pub state: ClusterState,
    pub now: u64,
}

impl Default for TestState {
    fn default() -> Self {
        TestState::new()
    }
}

/// `"cpu=4,x=1"` as a resource set.
pub fn res(text: &str) -> ResourceSet {
    text.parse().unwrap()
}

/// A resource name.
pub fn name(text: &str) -> ResourceName {
    ResourceName::new(text).unwrap()
}

/// A capacity from text (`"2"`, `"unbounded"`).
pub fn cap(text: &str) -> Capacity {
    text.parse().unwrap()
}

/// A namespace.
pub fn ns(text: &str) -> Namespace {
    Namespace::new(text).unwrap()
}

/// `set_resource(name, capacity, target)`.
pub fn set(resource: &str, capacity: &str, target: NodeSpec) -> ResourceUpdate {
    ResourceUpdate {
        name: name(resource),
        op: CapacityOp::Set(cap(capacity)),
        target,
    }
}

/// Changes `name` by a delta (`"+1"`, `"-0.5"`) on `target`.
pub fn adjust(resource: &str, delta: &str, target: NodeSpec) -> ResourceUpdate {
    ResourceUpdate {
        name: name(resource),
        op: CapacityOp::Adjust(delta.parse().unwrap()),
        target,
    }
}

/// `NodeSpec::Node(id)`.
pub fn on(node: NodeId) -> NodeSpec {
    NodeSpec::Node(node)
}

/// `NodeSpec::Match`.
pub fn matching(resources: &str, num_nodes: Option<u32>) -> NodeSpec {
    NodeSpec::Match {
        resources: res(resources),
        num_nodes,
    }
}

/// A `TaskFinished` report.
pub fn report(task: TaskId, attempt: u32, outcome: Result<TaskResult, String>) -> TaskFinished {
    TaskFinished {
        task_id: task,
        attempt,
        outcome,
        timed_out: false,
        output: None,
    }
}

/// Builds a [`TaskSpec`]; a command task (`true`) with no retries unless told otherwise.
#[derive(Debug, Clone)]
pub struct TaskBuilder {
    spec: TaskSpec,
}

/// A command task requesting `resources`.
pub fn task(resources: &str) -> TaskBuilder {
    TaskBuilder {
        spec: TaskSpec {
            name: "t".to_string(),
            kind: TaskKind::Command {
                argv: vec!["true".to_string()],
                env: Vec::new(),
                cwd: None,
            },
            resources: res(resources),
            labels: Labels::new(),
            max_retries: 0,
            timeout: None,
            pending_deadline: None,
            on_start: Vec::new(),
            on_success: Vec::new(),
        },
    }
}

impl TaskBuilder {
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.spec.labels.insert(key, value).unwrap();
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.spec.name = name.to_string();
        self
    }

    pub fn retries(mut self, n: u32) -> Self {
        self.spec.max_retries = n;
        self
    }

    pub fn timeout(mut self, d: Duration) -> Self {
        self.spec.timeout = Some(d);
        self
    }

    pub fn pending_deadline(mut self, d: Duration) -> Self {
        self.spec.pending_deadline = Some(d);
        self
    }

    pub fn on_start(mut self, update: ResourceUpdate) -> Self {
        self.spec.on_start.push(update);
        self
    }

    pub fn on_success(mut self, update: ResourceUpdate) -> Self {
        self.spec.on_success.push(update);
        self
    }

    /// Makes it a function task.
    pub fn function(mut self, handler: &str) -> Self {
        self.spec.kind = TaskKind::Function {
            name: handler.to_string(),
            args: vec![1, 2, 3].into(),
        };
        self
    }

    /// Makes it an actor of class `Counter`, named `name` if given.
    pub fn actor(mut self, name: Option<&str>) -> Self {
        self.spec.kind = TaskKind::Actor(Box::new(escher_proto::types::ActorSpec {
            class: "Counter".to_string(),
            args: Vec::new().into(),
            max_concurrency: 1,
            max_task_retries: 0,
            name: name.map(str::to_string),
            lifetime: escher_proto::types::Lifetime::Detached,
        }));
        self
    }

    /// Makes it a ghost task creating `creates` (`"bundle=4"`) on its node while it lives.
    pub fn ghost(mut self, creates: &str) -> Self {
        let creates = res(creates)
            .iter()
            .map(|(n, a)| (n.clone(), Capacity::Finite(a)))
            .collect();
        self.spec.kind = TaskKind::Ghost { creates, ttl: None };
        self
    }

    /// Makes it a ghost task creating `name` with an unbounded capacity.
    pub fn ghost_unbounded(mut self, resource: &str) -> Self {
        self.spec.kind = TaskKind::Ghost {
            creates: vec![(name(resource), Capacity::Unbounded)],
            ttl: None,
        };
        self
    }

    pub fn build(self) -> TaskSpec {
        self.spec
    }
}

/// Renders effects compactly: `assign 3->1 #1`, `cancel 3@1 #1`, `terminal 3`.
pub fn render(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|e| match e {
            Effect::Assign { node, assignment } => {
                format!(
                    "assign {}->{node} #{}",
                    assignment.task_id, assignment.attempt
                )
            }
            Effect::Cancel {
                node,
                task,
                attempt,
                ..
            } => format!("cancel {task}@{node} #{attempt}"),
            Effect::Terminal { task } => format!("terminal {task}"),
            Effect::ReconfigureMig { node, gpu, layout } => format!("mig {node}/{gpu} {layout}"),
            Effect::Rejoined { node } => format!("rejoined {node}"),
            Effect::DeleteObjects { node, ids } => {
                let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
                format!("delete {node} {}", ids.join(","))
            }
        })
        .collect()
}

/// What a step did: the reply and the effects it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub reply: Reply,
    pub effects: Vec<Effect>,
    /// The events it recorded for watchers.
    pub events: Vec<Recorded>,
}

impl Outcome {
    /// The effects, rendered.
    pub fn fx(&self) -> Vec<String> {
        render(&self.effects)
    }
}

impl TestState {
    pub fn new() -> TestState {
        TestState::with_config(StateConfig::default())
    }

    pub fn with_config(config: StateConfig) -> TestState {
        let mut state = ClusterState::new(config);
        let init = Command::Init {
            cluster_id: CLUSTER.to_string(),
            task_key: "key".to_string(),
        };
        state.apply(Entry::new(T0, init)).unwrap();
        TestState { state, now: T0 }
    }

    /// Applies a command at the current time, checks every invariant, and returns what it did.
    /// A refused command must change nothing and produce no effect.
    pub fn try_apply(&mut self, command: Command) -> Result<Outcome, ApplyError> {
        let before = format!("{:?}", self.state);
        let result = self.state.apply(Entry::new(self.now, command));
        let effects = self.state.take_effects();
        let events = self.state.take_events();
        check_invariants(&self.state);
        match result {
            Ok(reply) => Ok(Outcome {
                reply,
                effects,
                events,
            }),
            Err(err) => {
                assert!(
                    effects.is_empty(),
                    "a refused command produced effects: {effects:?}"
                );
                assert!(
                    events.is_empty(),
                    "a refused command recorded events: {events:?}"
                );
                assert_eq!(
                    before,
                    format!("{:?}", self.state),
                    "a refused command changed the state"
                );
                Err(err)
            }
        }
    }

    /// Applies a command that must be accepted.
    pub fn apply(&mut self, command: Command) -> Outcome {
        self.try_apply(command).unwrap()
    }

    /// Advances the clock.
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    /// Registers a node with `resources` and returns its id.
    pub fn node(&mut self, node_name: &str, resources: &str) -> NodeId {
        self.register(node_name, resources).0
    }

    /// Registers a new node; returns its id and the effects.
    pub fn register(&mut self, node_name: &str, resources: &str) -> (NodeId, Vec<String>) {
        let out = self.apply(register_command(node_name, resources));
        match out.reply {
            Reply::Registered(id) => (id, out.fx()),
            other => panic!("RegisterNode replied {other:?}"),
        }
    }

    /// A worker named `node_name` comes back as `node` from process boot `boot`, running
    /// `running` and reporting `finished`; returns what the state answered.
    pub fn rejoin(
        &mut self,
        node: NodeId,
        node_name: &str,
        boot: u64,
        running: &[(TaskId, u32)],
        finished: Vec<TaskFinished>,
    ) -> Result<(NodeId, Vec<String>), ApplyError> {
        let back = Returning {
            cluster: CLUSTER.to_string(),
            node,
            secret: secret(node_name),
            running: running
                .iter()
                .map(|&(task_id, attempt)| escher_proto::types::RunningTask { task_id, attempt })
                .collect(),
            finished,
        };
        let resources = "cpu=2";
        let out = self.try_apply(Command::RejoinNode {
            worker: joining(node_name, resources, boot),
            back,
        })?;
        match out.reply {
            Reply::Registered(id) => Ok((id, out.fx())),
            other => panic!("RejoinNode replied {other:?}"),
        }
    }

    /// Removes a node; returns the rendered effects.
    pub fn remove_node(&mut self, node: NodeId) -> Vec<String> {
        self.apply(Command::RemoveNode {
            node,
            reason: "heartbeat timeout".to_string(),
        })
        .fx()
    }

    /// Submits tasks in a namespace; returns their ids and the full outcome.
    pub fn submit_in(
        &mut self,
        namespace: Option<&str>,
        specs: Vec<TaskSpec>,
    ) -> (Vec<TaskId>, Outcome) {
        let out = self.apply(Command::Submit {
            tasks: specs,
            namespace: namespace.map(ns),
        });
        match &out.reply {
            Reply::Submitted(ids) => (ids.clone(), out),
            other => panic!("Submit replied {other:?}"),
        }
    }

    /// Submits one task without a namespace; returns its id and the rendered effects.
    pub fn submit(&mut self, spec: TaskBuilder) -> (TaskId, Vec<String>) {
        let (ids, out) = self.submit_in(None, vec![spec.build()]);
        (ids[0], out.fx())
    }

    /// `set_resource` calls from outside the cluster (no caller task).
    pub fn set_resources(
        &mut self,
        namespace: Option<&str>,
        updates: Vec<ResourceUpdate>,
    ) -> Result<Outcome, ApplyError> {
        self.try_apply(Command::SetResources {
            updates,
            namespace: namespace.map(ns),
            caller_task: None,
        })
    }

    /// A worker reports a task's end; returns the rendered effects.
    pub fn finish(&mut self, report: TaskFinished) -> Vec<String> {
        self.apply(Command::TaskFinished(report)).fx()
    }

    /// A worker reports the end of the current attempt of `task` with `outcome`.
    pub fn finish_current(
        &mut self,
        task: TaskId,
        outcome: Result<TaskResult, String>,
    ) -> Vec<String> {
        let attempt = self.state.task(task).unwrap().attempt;
        self.finish(report(task, attempt, outcome))
    }

    /// A command task of `task` exited with `code` (its current attempt).
    pub fn exit(&mut self, task: TaskId, code: i32) -> Vec<String> {
        self.finish_current(task, Ok(TaskResult::Exited { code }))
    }

    /// Cancels tasks.
    pub fn cancel(&mut self, tasks: &[TaskId]) -> Result<Outcome, ApplyError> {
        self.try_apply(Command::Cancel {
            tasks: tasks.to_vec(),
        })
    }

    /// Time passes to `now`.
    pub fn tick_at(&mut self, now: u64) -> Vec<String> {
        self.now = now;
        self.apply(Command::Tick).fx()
    }

    pub fn status(&self, task: TaskId) -> TaskStatus {
        self.state.status(task).unwrap()
    }

    pub fn task_state(&self, task: TaskId) -> TaskState {
        self.status(task).state
    }

    pub fn reason(&self, task: TaskId) -> String {
        self.status(task).reason.unwrap_or_default()
    }

    pub fn cluster(&self) -> ClusterStatus {
        self.state.cluster_status()
    }

    /// `(total, used)` of a resource on a node as text, from `cluster_status`.
    pub fn slot(&self, node: NodeId, resource: &str) -> Option<(String, String)> {
        let cluster = self.cluster();
        let status: &ResourceStatus = cluster.node(node)?.resource(resource)?;
        Some((status.total.to_string(), status.used.to_string()))
    }
}

/// The state machine's invariants, checked after every step: the core's own check, and that
/// the state and the core agree on which tasks are running where and which are pending.
pub fn check_invariants(state: &ClusterState) {
    let core = state.core();
    core.sanity_check().unwrap();
    let mut running = 0;
    let mut pending = 0;
    let mut unfinished: BTreeMap<Namespace, u64> = BTreeMap::new();
    let mut result_bytes: BTreeMap<Namespace, u64> = BTreeMap::new();
    let mut spec_bytes: BTreeMap<Namespace, u64> = BTreeMap::new();
    let mut creators: BTreeMap<ResourceName, BTreeSet<TaskId>> = BTreeMap::new();
    // Task ids are handed out from 1 without gaps (but for the ranges a restore or a lost log
    // tail skips, whose ids read as evicted records that never held a task); each one has its
    // record, or retention evicted it when it had finished (then the core has forgotten it
    // too). A skip leaves ranges of millions: past the first ids, only those with a record
    // are walked.
    let mut ids: BTreeSet<u64> = (1..state.next_task_id().0.min(1 << 16)).collect();
    ids.extend(state.task_ids().map(|t| t.0));
    for id in ids {
        let task = TaskId(id);
        if state.incarnation().skipped(id) {
            assert!(state.task(task).is_none() && state.evicted(task).is_none());
            continue;
        }
        let Some(rec) = state.task(task) else {
            let evicted = state
                .evicted(task)
                .expect("an id without a record was evicted");
            if let Some(tombstone) = evicted.tombstone {
                assert!(
                    tombstone.state.is_terminal(),
                    "task {task} evicted unfinished"
                );
                let status = state.status(task).unwrap();
                assert!(status.evicted && status.state == tombstone.state);
            }
            assert!(core.running_on(task).is_none() && !core.is_pending(task));
            assert!(state.is_finished(task) == evicted.tombstone.is_some());
            continue;
        };
        if !rec.state.is_terminal() {
            for name in rec.created_names() {
                creators.entry(name).or_default().insert(task);
            }
        }
        if let Some(ns) = rec.spec.labels.get(NAMESPACE_LABEL) {
            let ns: Namespace = ns.parse().unwrap();
            if !rec.state.is_terminal() {
                *unfinished.entry(ns.clone()).or_default() += 1;
            }
            *spec_bytes.entry(ns.clone()).or_default() += rec.spec.stored_bytes();
            if let Some(TaskResult::Returned(bytes)) = rec.result.as_deref() {
                *result_bytes.entry(ns).or_default() += bytes.len() as u64;
            }
        }
        match rec.state {
            TaskState::Running => {
                running += 1;
                assert_eq!(
                    core.running_on(task),
                    rec.node,
                    "task {task} runs where the core says"
                );
                assert!(
                    rec.node.is_some_and(|n| state.node_alive(n)),
                    "task {task} on a dead node"
                );
                assert!(rec.attempt >= 1);
            }
            TaskState::Pending => {
                pending += 1;
                assert!(
                    core.is_pending(task),
                    "task {task} is pending but the core lost it"
                );
                assert_eq!(
                    rec.pending_reason.as_deref(),
                    core.infeasible_reason(task),
                    "task {task}: the state's pending reason is not the core's"
                );
                assert!(rec.finished_at.is_none());
            }
            _ => {
                assert!(
                    core.running_on(task).is_none(),
                    "finished task {task} still runs"
                );
                assert!(!core.is_pending(task), "finished task {task} still pending");
                assert!(
                    rec.finished_at.is_some(),
                    "finished task {task} without a finish time"
                );
                assert!(rec.pending_reason.is_none());
            }
        }
    }
    assert_eq!(
        state.unfinished_by_namespace(),
        &unfinished,
        "the quota's unfinished counts are not the tasks'"
    );
    assert_eq!(
        state.result_bytes_by_namespace(),
        &result_bytes,
        "the quota's stored result bytes are not the tasks'"
    );
    assert_eq!(
        state.spec_bytes_by_namespace(),
        &spec_bytes,
        "the quota's spec bytes are not the tasks'"
    );
    assert_eq!(
        state.creators_by_name(),
        &creators,
        "the index of names created by hooks is not the tasks'"
    );
    assert!(state.task(state.next_task_id()).is_none());
    assert!(state.evicted(state.next_task_id()).is_none());
    assert_eq!(
        core.running_count(),
        running,
        "running tasks: core and state disagree"
    );
    assert_eq!(
        core.pending_count(),
        pending,
        "pending tasks: core and state disagree"
    );
    for node in core.node_ids() {
        assert!(
            state.node_alive(node),
            "the core has node {node} the state thinks dead"
        );
        for (task, attempt) in state.running_on(node) {
            let rec = state.task(task).unwrap();
            assert_eq!(
                (rec.state, rec.node, rec.attempt),
                (TaskState::Running, Some(node), attempt)
            );
        }
    }
    let status = state.cluster_status();
    assert_eq!(status.running_tasks as usize, running);
    assert_eq!(status.pending_tasks as usize, pending);
    for node in &status.nodes {
        // A live node that waits for its worker's stream is not in the core (`nodes.rs`).
        let admitted = node.alive && !state.waits_for_stream(node.id);
        assert_eq!(admitted, core.has_node(node.id));
        if !node.alive {
            assert!(
                node.resources.is_empty(),
                "lost node {} still shows resources",
                node.id
            );
        }
    }
    check_objects(state);
}

/// Every object copy is on a live node that carries its location resource (unbounded), and the
/// per-node index agrees with the holders; an object without a copy says why it was lost, or
/// waits for its task to run again (lineage).
fn check_objects(state: &ClusterState) {
    let table = state.objects();
    let mut by_node: BTreeMap<NodeId, BTreeSet<escher_proto::types::ObjectId>> = BTreeMap::new();
    for (id, rec) in table.iter() {
        if rec.holders.is_empty() && rec.lost.is_none() {
            // Being rebuilt (lineage): its task runs again.
            let escher_proto::types::ObjectOwner::Task(task) = rec.owner else {
                panic!("object {id} has no copy and is not lost");
            };
            let task_state = state.task(task).map(|r| r.state);
            assert!(
                matches!(task_state, Some(TaskState::Pending | TaskState::Running)),
                "object {id} waits for its rebuild, yet task {task} is {task_state:?}"
            );
        } else {
            assert_eq!(
                rec.holders.is_empty(),
                rec.lost.is_some(),
                "object {id}: holders {:?}, lost {:?}",
                rec.holders,
                rec.lost
            );
        }
        assert!(!table.was_freed(*id), "object {id} is both live and freed");
        let name = escher_core::state::location_resource(*id, rec.namespace.as_ref());
        for node in &rec.holders {
            assert!(
                state.node_alive(*node),
                "object {id} held by dead node {node}"
            );
            assert_eq!(
                state.core().capacity(*node, name.as_str()),
                Some(Capacity::Unbounded),
                "object {id} on node {node} has no location resource {name}"
            );
            by_node.entry(*node).or_default().insert(*id);
        }
    }
    for (node, ids) in &by_node {
        let held: BTreeSet<_> = table.held_by(*node).collect();
        assert_eq!(&held, ids, "the index of node {node}");
    }
}

/// Records `copies` with `ObjectsSealed`; the copies left out, with why.
pub fn seal(t: &mut TestState, copies: Vec<SealedCopy>) -> Vec<(ObjectId, String)> {
    match t.apply(Command::ObjectsSealed { copies }).reply {
        Reply::ObjectsSealed(dropped) => dropped,
        other => panic!("ObjectsSealed replied {other:?}"),
    }
}

/// `t`'s state as a replica restored from its snapshot holds it: the image, then the object
/// table, each through bincode as the head's codec writes them, and the registration numbers.
pub fn restored(t: &TestState) -> ClusterState {
    let config = bincode::config::standard();
    let image = bincode::serde::encode_to_vec(&t.state, config).unwrap();
    let table = bincode::serde::encode_to_vec(t.state.objects(), config).unwrap();
    let (state, _): (ClusterState, usize) =
        bincode::serde::decode_from_slice(&image, config).unwrap();
    let mut back = state.restore(StateConfig::default());
    let (objects, _) = bincode::serde::decode_from_slice(&table, config).unwrap();
    back.set_objects(objects);
    back.set_registrations(t.state.registrations().clone());
    back
}
