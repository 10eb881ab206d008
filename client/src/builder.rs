//! [`Task`]: the builder of [`TaskSpec`]s, and [`IntoTaskSpec`], which lets `submit` take
//! either a builder or a finished spec.
//!
//! A builder collects every mistake instead of panicking or silently ignoring it (a bad
//! resource list, an option that does not apply to the task's kind, an empty command) and
//! [`Task::build`] reports them all at once in a [`ClientError::Usage`]:
//!
//! ```
//! use escher_client::Task;
//! use std::time::Duration;
//!
//! let spec = Task::command(["python", "train.py"])
//!     .resources_str("cpu=2,gpu=0.5")
//!     .resource("dataset-a", 1)
//!     .max_retries(2)
//!     .timeout(Duration::from_secs(600))
//!     .build()?;
//! assert_eq!(spec.name, "python");
//!
//! let err = Task::command(["true"]).ttl(Duration::from_secs(1)).build().unwrap_err();
//! assert!(err.to_string().contains("ttl applies only to ghost tasks"));
//! # Ok::<(), escher_client::ClientError>(())
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use escher_proto::types::{
    ActorSpec, Lifetime, MAX_ARGV, MAX_ENV, MAX_HOOK_UPDATES, MAX_LABELS, MAX_NAME_BYTES,
    MAX_RESOURCES, MAX_TASK_NAME_BYTES, TaskId,
};
use escher_proto::{Labels, ResourceSet, ResourceUpdate, TaskKind, TaskSpec, codec};
use serde::Serialize;

use crate::ClientError;
use crate::args::{IntoAmount, IntoCapacity, IntoResourceName};

/// What a command or function task requests when no resource option was given: one CPU, as
/// Ray gives each task unless told otherwise.
pub const DEFAULT_RESOURCES: &str = "cpu=1";

/// A task under construction. Start with [`Task::command`], [`Task::function`],
/// [`Task::function_typed`] or [`Task::ghost`], chain options, and finish with
/// [`Task::build`] (or hand the builder straight to `Client::submit`).
#[derive(Debug, Clone)]
#[must_use = "a task builder does nothing until it is built or submitted"]
pub struct Task {
    name: Option<String>,
    kind: TaskKind,
    resources: ResourceSet,
    /// Whether any resource option was given; if none was, a command or function task
    /// requests [`DEFAULT_RESOURCES`].
    resources_given: bool,
    labels: Labels,
    max_retries: u32,
    timeout: Option<Duration>,
    pending_deadline: Option<Duration>,
    on_start: Vec<ResourceUpdate>,
    on_success: Vec<ResourceUpdate>,
    problems: Vec<String>,
}

impl Task {
    fn new(kind: TaskKind) -> Task {
        Task {
            name: None,
            kind,
            resources: ResourceSet::new(),
            resources_given: false,
            labels: Labels::new(),
            max_retries: 0,
            timeout: None,
            pending_deadline: None,
            on_start: Vec::new(),
            on_success: Vec::new(),
            problems: Vec::new(),
        }
    }

    /// A command task: `argv[0]` is looked up on the worker's `PATH`, stdout and stderr are
    /// kept, and the exit code is the result.
    pub fn command<I, S>(argv: I) -> Task
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Task::new(TaskKind::Command {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            cwd: None,
        })
    }

    /// A function task: calls the handler registered as `name` in a worker with these
    /// argument bytes; its result is the bytes the handler returns.
    pub fn function(name: impl Into<String>, args: Vec<u8>) -> Task {
        Task::new(TaskKind::Function {
            name: name.into(),
            args: args.into(),
        })
    }

    /// A function task whose arguments are `args` encoded with [`escher_proto::codec`]
    /// (bincode), as the worker library decodes them.
    pub fn function_typed<A: Serialize + ?Sized>(name: impl Into<String>, args: &A) -> Task {
        match codec::encode(args) {
            Ok(bytes) => Task::function(name, bytes),
            Err(e) => Task::function(name, Vec::new()).problem(format!("arguments: {e}")),
        }
    }

    /// A ghost task: no process; it holds its resources and, while it lives, the resources it
    /// [`creates`](Task::creates) on its node. It ends when cancelled or when its
    /// [`ttl`](Task::ttl) passes.
    pub fn ghost() -> Task {
        Task::new(TaskKind::Ghost {
            creates: Vec::new(),
            ttl: None,
        })
    }

    /// An actor (docs/DESIGN.md §17): an instance of the class a worker registered as
    /// `class` ([`ActorClass`](https://docs.rs/escher-worker) in the worker library), made with
    /// these constructor argument bytes, that holds the task's resources from start to exit and
    /// answers method calls. Create it with [`Client::actor`](crate::Client::actor).
    pub fn actor(class: impl Into<String>, args: Vec<u8>) -> Task {
        Task::new(TaskKind::Actor(Box::new(ActorSpec {
            class: class.into(),
            args: args.into(),
            max_concurrency: 1,
            max_task_retries: 0,
            name: None,
            lifetime: Lifetime::Owned,
        })))
    }

    /// An actor whose constructor's arguments are `args` encoded with [`escher_proto::codec`].
    pub fn actor_typed<A: Serialize + ?Sized>(class: impl Into<String>, args: &A) -> Task {
        match codec::encode(args) {
            Ok(bytes) => Task::actor(class, bytes),
            Err(e) => Task::actor(class, Vec::new()).problem(format!("arguments: {e}")),
        }
    }

    fn actor_spec(&mut self, option: &str) -> Result<&mut ActorSpec, String> {
        let kind = self.kind_name();
        match &mut self.kind {
            TaskKind::Actor(actor) => Ok(actor),
            _ => Err(format!("{option} applies only to actors, not {kind}")),
        }
    }

    fn with_actor(mut self, option: &str, change: impl FnOnce(&mut ActorSpec)) -> Task {
        match self.actor_spec(option) {
            Ok(actor) => {
                change(actor);
                self
            }
            Err(why) => self.problem(why),
        }
    }

    /// Restarts an actor up to `n` times after its process or node dies (its constructor runs
    /// again; its state is lost): the actor's task's [`max_retries`](Task::max_retries).
    pub fn max_restarts(self, n: u32) -> Task {
        let kind = self.kind_name();
        if !matches!(self.kind, TaskKind::Actor(_)) {
            return self.problem(format!(
                "max_restarts applies only to actors, not {kind} (use max_retries)"
            ));
        }
        self.max_retries(n)
    }

    /// How many calls an actor may run at once (1, the default: one after another, in the
    /// order each caller sent them).
    pub fn max_concurrency(self, n: u32) -> Task {
        self.with_actor("max_concurrency", |a| a.max_concurrency = n)
    }

    /// How many times a call in flight when an actor's incarnation died is sent again to the
    /// next incarnation (0, the default: it fails with the reason).
    pub fn max_task_retries(self, n: u32) -> Task {
        self.with_actor("max_task_retries", |a| a.max_task_retries = n)
    }

    /// Names an actor, so that any caller of its namespace finds it with
    /// [`Client::actor_named`](crate::Client::actor_named); live actors' names are unique per
    /// namespace.
    pub fn actor_name(self, name: impl Into<String>) -> Task {
        let name = name.into();
        self.with_actor("actor_name", |a| a.name = Some(name))
    }

    /// Makes an actor live until it is killed, whatever happens to the handles of its creator.
    pub fn detached(self) -> Task {
        self.with_actor("detached", |a| a.lifetime = Lifetime::Detached)
    }

    fn problem(mut self, text: String) -> Task {
        self.problems.push(text);
        self
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            TaskKind::Command { .. } => "a command task",
            TaskKind::Function { .. } => "a function task",
            TaskKind::Ghost { .. } => "a ghost task",
            TaskKind::Actor(_) => "an actor",
        }
    }

    /// A human-readable name (not unique; at most 256 bytes). Defaults to the program's file
    /// name, the function's name, or `ghost`.
    pub fn name(mut self, name: impl Into<String>) -> Task {
        self.name = Some(name.into());
        self
    }

    /// Requires these resources, replacing earlier amounts of the same names. Any resource
    /// option replaces the default of one CPU ([`DEFAULT_RESOURCES`]); `cpu=0` (or an empty
    /// set) asks for nothing at all.
    pub fn resources(mut self, set: ResourceSet) -> Task {
        self.resources_given = true;
        for (name, amount) in set.iter() {
            self.resources.insert(name.clone(), amount);
        }
        self
    }

    /// Adds `set` to what the task requires: amounts of a resource it already requires add up
    /// (the AND of two requirement sets, as scheduling libraries compose them).
    pub fn add_resources(mut self, set: &ResourceSet) -> Task {
        self.resources_given = true;
        match self.resources.merge(set) {
            Ok(()) => self,
            Err(e) => self.problem(format!("resources: {e}")),
        }
    }

    /// Requires resources written as `cpu=1,x=2`; a malformed list is reported by
    /// [`Task::build`] with the column of the bad item.
    pub fn resources_str(self, text: &str) -> Task {
        match text.parse::<ResourceSet>() {
            Ok(set) => self.resources(set),
            Err(e) => self.problem(format!("resources {text:?}: {e}")),
        }
    }

    /// Requires `amount` of `name` (`.resource("cpu", 2)`, `.resource("gpu", "0.5")`),
    /// replacing an earlier amount of it.
    pub fn resource(mut self, name: impl IntoResourceName, amount: impl IntoAmount) -> Task {
        self.resources_given = true;
        match (name.into_resource_name(), amount.into_amount()) {
            (Ok(name), Ok(amount)) => {
                self.resources.insert(name, amount);
                self
            }
            (Err(e), _) | (_, Err(e)) => self.problem(format!("resource: {e}")),
        }
    }

    /// Adds a label (shown by `escher tasks` and `escher info`).
    pub fn label(mut self, key: &str, value: &str) -> Task {
        match self.labels.insert(key, value) {
            Ok(()) => self,
            Err(e) => self.problem(e.to_string()),
        }
    }

    /// Passes object `object` to the task as an argument, by reference: the head places the
    /// task, by default, on a node that holds a copy when one has room (soft locality, never
    /// a reason to wait), and the worker brings the object into its own store, worker to
    /// worker, before the task runs; a function reads it with `TaskContext::object_arg`.
    /// Each call adds one (they ride in the task's `escher.objects` label, at most 256 bytes:
    /// about ten objects). Keep `object` (or a clone) until the task has ended: dropping the
    /// last reference releases the object, and a task submitted after that is refused.
    /// For hard locality, request the location resource instead
    /// (`.resource(format!("object.{}", object.id()), 1)`).
    #[cfg(feature = "grpc")]
    pub fn object_arg(self, object: &crate::ObjectRef) -> Task {
        self.object_arg_id(object.id())
    }

    /// Says that the task reads task `task`'s result (dataflow): when that result is larger
    /// than the inline threshold it stays, as an object, on the worker that made it, and the
    /// head places this task, by default, on a node that holds a copy when one has room (soft
    /// locality, as for [`object_arg`](Self::object_arg), after those). `task` may still be
    /// running: the preference is read when this task is placed. Each call adds one (the
    /// task's `escher.result-args` label, at most 256 bytes: about twenty tasks).
    pub fn result_arg(self, task: TaskId) -> Task {
        use escher_proto::types::{RESULT_ARGS_LABEL, format_result_args, parse_result_args};
        self.listed(
            RESULT_ARGS_LABEL,
            task,
            |v| parse_result_args(v).ok(),
            format_result_args,
        )
    }

    /// [`object_arg`](Self::object_arg) by id (an object this client does not hold a
    /// reference to, such as another task's result).
    pub fn object_arg_id(self, id: escher_proto::types::ObjectId) -> Task {
        use escher_proto::types::{OBJECTS_LABEL, format_object_args, parse_object_args};
        self.listed(
            OBJECTS_LABEL,
            id,
            |v| parse_object_args(v).ok(),
            format_object_args,
        )
    }

    /// Adds `item` to the list label `key` (read with `parse`, written with `format`) unless
    /// it is there already.
    fn listed<T: PartialEq>(
        self,
        key: &str,
        item: T,
        parse: impl Fn(&str) -> Option<Vec<T>>,
        format: impl Fn(&[T]) -> String,
    ) -> Task {
        let mut items = self.labels.get(key).and_then(parse).unwrap_or_default();
        if !items.contains(&item) {
            items.push(item);
        }
        let value = format(&items);
        self.label(key, &value)
    }

    /// Runs the task up to `n` more times after a failure or a lost node.
    pub fn max_retries(mut self, n: u32) -> Task {
        self.max_retries = n;
        self
    }

    /// Stops the task when it has run this long.
    pub fn timeout(mut self, limit: Duration) -> Task {
        self.timeout = Some(limit);
        self
    }

    /// Fails the task if it is still pending after this long (for example because no node
    /// has its resources), instead of waiting forever.
    pub fn pending_deadline(mut self, limit: Duration) -> Task {
        self.pending_deadline = Some(limit);
        self
    }

    /// Sets an environment variable of a command task (a later value for the same name wins).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Task {
        let kind = self.kind_name();
        match &mut self.kind {
            TaskKind::Command { env, .. } => {
                env.push((name.into(), value.into()));
                self
            }
            _ => self.problem(format!("env applies only to command tasks, not {kind}")),
        }
    }

    /// Runs a command task in this working directory (the worker's own by default).
    pub fn cwd(mut self, dir: impl Into<String>) -> Task {
        let kind = self.kind_name();
        match &mut self.kind {
            TaskKind::Command { cwd, .. } => {
                *cwd = Some(dir.into());
                self
            }
            _ => self.problem(format!("cwd applies only to command tasks, not {kind}")),
        }
    }

    /// Makes a ghost task create resource `name` with `capacity` on its node while it lives.
    pub fn creates(mut self, name: impl IntoResourceName, capacity: impl IntoCapacity) -> Task {
        let kind = self.kind_name();
        let (name, capacity) = match (name.into_resource_name(), capacity.into_capacity()) {
            (Ok(name), Ok(capacity)) => (name, capacity),
            (Err(e), _) | (_, Err(e)) => return self.problem(format!("creates: {e}")),
        };
        match &mut self.kind {
            TaskKind::Ghost { creates, .. } => {
                creates.push((name, capacity));
                self
            }
            _ => self.problem(format!("creates applies only to ghost tasks, not {kind}")),
        }
    }

    /// Ends a ghost task by itself after this long.
    pub fn ttl(mut self, after: Duration) -> Task {
        let kind = self.kind_name();
        match &mut self.kind {
            TaskKind::Ghost { ttl, .. } => {
                *ttl = Some(after);
                self
            }
            _ => self.problem(format!("ttl applies only to ghost tasks, not {kind}")),
        }
    }

    /// Applies a resource change when the task starts (task signalling). `NodeSpec::Local`
    /// means the task's own node.
    pub fn on_start(mut self, update: ResourceUpdate) -> Task {
        self.on_start.push(update);
        self
    }

    /// Applies a resource change when the task succeeds (task signalling), e.g.
    /// `ResourceUpdate::set("done-t1", 1, NodeSpec::Local)?` to release the tasks that wait
    /// for `done-t1`.
    pub fn on_success(mut self, update: ResourceUpdate) -> Task {
        self.on_success.push(update);
        self
    }

    /// The finished spec, or every mistake found, in one [`ClientError::Usage`].
    pub fn build(self) -> Result<TaskSpec, ClientError> {
        let mut problems = self.problems;
        let name = match self.name {
            Some(name) => name,
            None => default_name(&self.kind),
        };
        if name.len() > MAX_TASK_NAME_BYTES {
            problems.push(format!(
                "the name is {} bytes; the limit is {MAX_TASK_NAME_BYTES}",
                name.len()
            ));
        }
        check_kind(&self.kind, &mut problems);
        if self.timeout == Some(Duration::ZERO) {
            problems.push("a timeout of zero would stop the task at once".to_string());
        }
        let counts = [
            ("resources", self.resources.len(), MAX_RESOURCES),
            ("labels", self.labels.len(), MAX_LABELS),
            ("on_start updates", self.on_start.len(), MAX_HOOK_UPDATES),
            (
                "on_success updates",
                self.on_success.len(),
                MAX_HOOK_UPDATES,
            ),
        ];
        for (what, len, max) in counts {
            if len > max {
                problems.push(format!("{len} {what}; the limit is {max}"));
            }
        }
        if !problems.is_empty() {
            return Err(ClientError::Usage(format!(
                "invalid task {name:?}: {}",
                problems.join("; ")
            )));
        }
        let mut resources = self.resources;
        let runs = !matches!(self.kind, TaskKind::Ghost { .. });
        if runs && !self.resources_given {
            // As Ray: a task that says nothing takes one CPU, so that a node runs as many
            // unannotated tasks at once as it has CPUs.
            resources = DEFAULT_RESOURCES.parse().expect("a valid resource list");
        }
        Ok(TaskSpec {
            name,
            kind: self.kind,
            resources,
            labels: self.labels,
            max_retries: self.max_retries,
            timeout: self.timeout,
            pending_deadline: self.pending_deadline,
            on_start: self.on_start,
            on_success: self.on_success,
        })
    }
}

/// The name a task gets when none is given.
fn default_name(kind: &TaskKind) -> String {
    let name = match kind {
        TaskKind::Command { argv, .. } => argv
            .first()
            .map(|program| program.rsplit('/').next().unwrap_or(program))
            .unwrap_or("command"),
        TaskKind::Function { name, .. } => name,
        TaskKind::Ghost { .. } => "ghost",
        TaskKind::Actor(actor) => actor.name.as_deref().unwrap_or(&actor.class),
    };
    let mut end = name.len().min(MAX_TASK_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// The rules of the wire protocol for each kind, checked before anything is sent.
fn check_kind(kind: &TaskKind, problems: &mut Vec<String>) {
    match kind {
        TaskKind::Command { argv, env, cwd } => {
            match argv.first() {
                None => problems.push("a command task needs a program to run".to_string()),
                Some(program) if program.is_empty() => {
                    problems.push("the program (argv[0]) is empty".to_string());
                }
                Some(_) => {}
            }
            if argv.len() > MAX_ARGV {
                problems.push(format!("{} arguments; the limit is {MAX_ARGV}", argv.len()));
            }
            if argv.iter().any(|a| a.contains('\0')) {
                problems.push("an argument contains a NUL byte".to_string());
            }
            if env.len() > MAX_ENV {
                problems.push(format!(
                    "{} env variables; the limit is {MAX_ENV}",
                    env.len()
                ));
            }
            for (name, value) in env {
                if name.is_empty() || name.contains(['=', '\0']) {
                    problems.push(format!(
                        "env variable name {name:?} must be non-empty, without '=' or NUL"
                    ));
                }
                if value.contains('\0') {
                    problems.push(format!("env variable {name:?} has a NUL byte in its value"));
                }
            }
            if let Some(dir) = cwd
                && (dir.is_empty() || dir.contains('\0'))
            {
                problems.push(format!("cwd {dir:?} must be non-empty, without NUL"));
            }
        }
        TaskKind::Function { name, .. } => {
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                problems.push(format!(
                    "a function name is 1 to {MAX_NAME_BYTES} bytes, not {}",
                    name.len()
                ));
            }
        }
        TaskKind::Ghost { creates, .. } => {
            let mut seen = BTreeSet::new();
            for (name, _) in creates {
                if !seen.insert(name) {
                    problems.push(format!("the ghost creates {name} twice"));
                }
            }
            if creates.len() > MAX_RESOURCES {
                problems.push(format!(
                    "the ghost creates {} resources; the limit is {MAX_RESOURCES}",
                    creates.len()
                ));
            }
        }
        TaskKind::Actor(actor) => {
            if actor.class.is_empty() || actor.class.len() > MAX_NAME_BYTES {
                problems.push(format!(
                    "an actor class name is 1 to {MAX_NAME_BYTES} bytes, not {}",
                    actor.class.len()
                ));
            }
            if let Some(problem) = actor.problem() {
                problems.push(problem);
            }
        }
    }
}

/// Something `Client::submit` accepts: a finished [`TaskSpec`], or a [`Task`] builder that is
/// built first (its mistakes are returned before anything is sent).
pub trait IntoTaskSpec {
    /// The spec to submit.
    fn into_task_spec(self) -> Result<TaskSpec, ClientError>;

    /// The spec to submit, with `default` as what a command or function task that names no
    /// resources requests (a client's [`Client::with_default_resources`](crate::Client));
    /// a finished spec is taken as it is.
    fn into_task_spec_with(self, default: Option<&ResourceSet>) -> Result<TaskSpec, ClientError>
    where
        Self: Sized,
    {
        let _ = default;
        self.into_task_spec()
    }
}

impl IntoTaskSpec for TaskSpec {
    fn into_task_spec(self) -> Result<TaskSpec, ClientError> {
        Ok(self)
    }
}

impl IntoTaskSpec for Task {
    fn into_task_spec(self) -> Result<TaskSpec, ClientError> {
        self.build()
    }

    fn into_task_spec_with(self, default: Option<&ResourceSet>) -> Result<TaskSpec, ClientError> {
        match default {
            Some(set) if !self.resources_given => self.resources(set.clone()).build(),
            _ => self.build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use escher_proto::{Amount, Capacity, CapacityOp, NodeSpec, ResourceName};

    use super::*;
    use crate::ResourceUpdateExt;

    fn usage(task: Task) -> String {
        match task.build() {
            Err(ClientError::Usage(text)) => text,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn command_with_every_option() {
        let spec = Task::command(["/usr/bin/python3", "-c", "print(1)"])
            .resources_str("cpu=1,x=2")
            .resource("x", 3)
            .resource("gpu", "0.5")
            .label("team", "a")
            .max_retries(2)
            .timeout(Duration::from_secs(5))
            .pending_deadline(Duration::from_secs(1))
            .env("A", "1")
            .cwd("/tmp")
            .on_start(ResourceUpdate::adjust("busy", 1, NodeSpec::Local).unwrap())
            .on_success(ResourceUpdate::set("done-t1", 1, NodeSpec::Local).unwrap())
            .build()
            .unwrap();
        assert_eq!(spec.name, "python3");
        assert_eq!(spec.resources.to_string(), "cpu=1,gpu=0.5,x=3");
        assert_eq!(spec.labels.get("team"), Some("a"));
        assert_eq!(spec.max_retries, 2);
        assert_eq!(spec.timeout, Some(Duration::from_secs(5)));
        assert_eq!(spec.pending_deadline, Some(Duration::from_secs(1)));
        let TaskKind::Command { argv, env, cwd } = &spec.kind else {
            panic!("not a command: {:?}", spec.kind);
        };
        assert_eq!(argv.len(), 3);
        assert_eq!(env, &[("A".to_string(), "1".to_string())]);
        assert_eq!(cwd.as_deref(), Some("/tmp"));
        assert_eq!(spec.on_start.len(), 1);
        assert_eq!(
            spec.on_success[0].op,
            CapacityOp::Set(Capacity::Finite(Amount::ONE))
        );
    }

    #[test]
    fn function_and_ghost() {
        let spec = Task::function_typed("add", &(1u32, 2u32)).build().unwrap();
        assert_eq!(spec.name, "add");
        let TaskKind::Function { args, .. } = &spec.kind else {
            panic!("not a function");
        };
        assert_eq!(codec::decode::<(u32, u32)>(args).unwrap(), (1, 2));

        let spec = Task::ghost()
            .name("gang-0")
            .resource("cpu", 1)
            .creates("gang-slot", 4)
            .creates("loc", Capacity::Unbounded)
            .ttl(Duration::from_secs(30))
            .build()
            .unwrap();
        let TaskKind::Ghost { creates, ttl } = &spec.kind else {
            panic!("not a ghost");
        };
        assert_eq!(creates.len(), 2);
        assert_eq!(creates[1].0, ResourceName::new("loc").unwrap());
        assert_eq!(*ttl, Some(Duration::from_secs(30)));
        assert_eq!(Task::ghost().build().unwrap().name, "ghost");
    }

    #[test]
    fn a_task_that_names_no_resources_takes_one_cpu() {
        let spec = Task::command(["true"]).build().unwrap();
        assert_eq!(spec.resources.to_string(), "cpu=1");
        let spec = Task::function("f", Vec::new()).build().unwrap();
        assert_eq!(spec.resources.to_string(), "cpu=1");
        // Any resource option replaces the default, and cpu=0 asks for no CPU.
        let spec = Task::command(["true"]).resource("x", 1).build().unwrap();
        assert_eq!(spec.resources.to_string(), "x=1");
        let spec = Task::command(["true"])
            .resources_str("cpu=0")
            .build()
            .unwrap();
        assert!(spec.resources.get("cpu").is_zero(), "{}", spec.resources);
        // Ghosts keep their own rule: they hold what they are given.
        let spec = Task::ghost().creates("r", 1).build().unwrap();
        assert!(spec.resources.is_empty());
        // A client's default replaces cpu=1 for tasks that name nothing, and only for them.
        let default: ResourceSet = "slot=1".parse().unwrap();
        let spec = Task::command(["true"])
            .into_task_spec_with(Some(&default))
            .unwrap();
        assert_eq!(spec.resources.to_string(), "slot=1");
        let spec = Task::command(["true"])
            .resource("x", 2)
            .into_task_spec_with(Some(&default))
            .unwrap();
        assert_eq!(spec.resources.to_string(), "x=2");
        let empty = Task::command(["true"])
            .into_task_spec_with(Some(&ResourceSet::new()))
            .unwrap();
        assert!(empty.resources.is_empty());
    }

    #[test]
    fn misuse_is_an_error_not_ignored() {
        let text = usage(Task::command(["true"]).creates("x", 1).ttl(Duration::ZERO));
        assert!(
            text.contains("creates applies only to ghost tasks"),
            "{text}"
        );
        assert!(text.contains("ttl applies only to ghost tasks"), "{text}");
        let text = usage(Task::ghost().env("A", "1").cwd("/"));
        assert!(text.contains("env applies only to command tasks"), "{text}");
        assert!(text.contains("cwd applies only to command tasks"), "{text}");
        let text = usage(Task::function("f", vec![]).ttl(Duration::from_secs(1)));
        assert!(text.contains("not a function task"), "{text}");
    }

    #[test]
    fn bad_values_are_reported_with_where() {
        let text = usage(Task::command(["true"]).resources_str("cpu=1,x"));
        assert!(text.contains("column 7"), "{text}");
        let text = usage(Task::command(["true"]).resource("b@d", 1));
        assert!(text.contains("invalid resource name"), "{text}");
        let text = usage(Task::command(["true"]).resource("cpu", -1));
        assert!(text.contains("negative"), "{text}");
        let text = usage(Task::command(["true"]).label("k", "a b"));
        assert!(text.contains("invalid label"), "{text}");
        let text = usage(Task::ghost().creates("x", 1).creates("x", 2));
        assert!(text.contains("creates x twice"), "{text}");
        let text = usage(Task::command(["true"]).env("A=B", "1"));
        assert!(text.contains("without '='"), "{text}");
        let text = usage(Task::command(["true"]).timeout(Duration::ZERO));
        assert!(text.contains("timeout of zero"), "{text}");
        let text = usage(Task::function("", vec![]));
        assert!(text.contains("function name"), "{text}");
        let text = usage(Task::command(["true"]).name("n".repeat(300)));
        assert!(text.contains("limit is 256"), "{text}");
    }

    #[test]
    fn empty_commands_are_rejected() {
        let text = usage(Task::command(Vec::<String>::new()));
        assert!(text.contains("needs a program"), "{text}");
        let text = usage(Task::command([""]));
        assert!(text.contains("argv[0]"), "{text}");
        let text = usage(Task::command(["a\0b"]));
        assert!(text.contains("NUL"), "{text}");
    }

    #[test]
    fn specs_and_builders_both_submit() {
        let spec = Task::command(["true"]).build().unwrap();
        assert_eq!(spec.clone().into_task_spec().unwrap(), spec);
        assert_eq!(Task::command(["true"]).into_task_spec().unwrap(), spec);
        assert!(
            Task::command(["true"])
                .resources_str("=")
                .into_task_spec()
                .is_err()
        );
    }
}
