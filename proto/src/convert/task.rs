//! Conversions of tasks: specs and kinds (with the limits of [`super`]), states, results and
//! statuses.

use super::{
    At, ConvertError, MAX_ARGV, MAX_ENV, MAX_HOOK_UPDATES, MAX_NAME_BYTES, MAX_RESOURCES,
    MAX_TASK_NAME_BYTES, Problem, check_count, check_len, check_name, check_no_nul,
    check_printable, convert_list, convert_optional, duration_to_ms, key_segment, ms_to_duration,
    required,
};
use crate::types::{
    ActorSpec, Capacity, Labels, Lifetime, NodeId, ResourceName, ResourceSet, ResourceUpdate,
    TaskId, TaskKind, TaskResult, TaskSpec, TaskState, TaskStatus, TypeError,
};
use crate::wire;
use crate::wire::{task_result, task_spec};

impl From<TaskSpec> for wire::TaskSpec {
    fn from(s: TaskSpec) -> Self {
        wire::TaskSpec {
            name: s.name,
            kind: Some(s.kind.into()),
            resources: s.resources.into(),
            labels: s.labels.into(),
            max_retries: s.max_retries,
            timeout_ms: s.timeout.map(duration_to_ms),
            pending_deadline_ms: s.pending_deadline.map(duration_to_ms),
            on_start: s.on_start.into_iter().map(Into::into).collect(),
            on_success: s.on_success.into_iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<wire::TaskSpec> for TaskSpec {
    type Error = ConvertError;
    fn try_from(w: wire::TaskSpec) -> Result<Self, ConvertError> {
        check_len("name", &w.name, MAX_TASK_NAME_BYTES)?;
        check_printable("name", &w.name)?;
        check_no_nul("name", &w.name)?;
        Ok(TaskSpec {
            name: w.name,
            kind: TaskKind::try_from(required(w.kind, "kind")?)?,
            resources: ResourceSet::try_from(w.resources).at("resources")?,
            labels: Labels::try_from(w.labels).at("labels")?,
            max_retries: w.max_retries,
            timeout: w.timeout_ms.map(ms_to_duration),
            pending_deadline: w.pending_deadline_ms.map(ms_to_duration),
            on_start: convert_list(w.on_start, "on_start", MAX_HOOK_UPDATES, |u| {
                ResourceUpdate::try_from(u)
            })?,
            on_success: convert_list(w.on_success, "on_success", MAX_HOOK_UPDATES, |u| {
                ResourceUpdate::try_from(u)
            })?,
        })
    }
}

impl From<TaskKind> for task_spec::Kind {
    fn from(kind: TaskKind) -> Self {
        match kind {
            TaskKind::Command { argv, env, cwd } => task_spec::Kind::Command(wire::CommandTask {
                argv,
                env: env
                    .into_iter()
                    .map(|(name, value)| wire::EnvVar { name, value })
                    .collect(),
                cwd,
            }),
            TaskKind::Function { name, args } => {
                task_spec::Kind::Function(wire::FunctionTask { name, args })
            }
            TaskKind::Ghost { creates, ttl } => task_spec::Kind::Ghost(wire::GhostTask {
                creates: creates
                    .into_iter()
                    .map(|(name, capacity)| wire::ResourceCapacity {
                        name: name.into(),
                        capacity: Some(capacity.into()),
                    })
                    .collect(),
                ttl_ms: ttl.map(duration_to_ms),
            }),
            TaskKind::Actor(actor) => {
                let ActorSpec {
                    class,
                    args,
                    max_concurrency,
                    max_task_retries,
                    name,
                    lifetime,
                } = *actor;
                task_spec::Kind::Actor(wire::ActorTask {
                    class,
                    args,
                    max_concurrency,
                    max_task_retries,
                    name: name.unwrap_or_default(),
                    detached: lifetime == Lifetime::Detached,
                })
            }
        }
    }
}

impl TryFrom<task_spec::Kind> for TaskKind {
    type Error = ConvertError;

    /// Errors are relative to the task spec: `command.argv`, `ghost.creates["x"]`, ...
    fn try_from(kind: task_spec::Kind) -> Result<Self, ConvertError> {
        match kind {
            task_spec::Kind::Command(c) => command(c).at("command"),
            task_spec::Kind::Function(f) => {
                check_name("name", &f.name, MAX_NAME_BYTES).at("function")?;
                Ok(TaskKind::Function {
                    name: f.name,
                    args: super::kept(f.args),
                })
            }
            task_spec::Kind::Ghost(g) => ghost(g).at("ghost"),
            task_spec::Kind::Actor(a) => actor(a).at("actor"),
        }
    }
}

fn actor(a: wire::ActorTask) -> Result<TaskKind, ConvertError> {
    check_name("class", &a.class, MAX_NAME_BYTES)?;
    if a.max_concurrency == 0 || a.max_concurrency > crate::types::MAX_CONCURRENCY {
        return Err(ConvertError::new(
            "max_concurrency",
            Problem::Rule("must be 1 to 1024: how many calls the actor may run at once"),
        ));
    }
    if !a.name.is_empty() {
        check_len("name", &a.name, crate::types::MAX_ACTOR_NAME_BYTES)?;
        check_printable("name", &a.name)?;
        check_no_nul("name", &a.name)?;
    }
    Ok(TaskKind::Actor(Box::new(ActorSpec {
        class: a.class,
        args: super::kept(a.args),
        max_concurrency: a.max_concurrency,
        max_task_retries: a.max_task_retries,
        name: (!a.name.is_empty()).then_some(a.name),
        lifetime: if a.detached {
            Lifetime::Detached
        } else {
            Lifetime::Owned
        },
    })))
}

fn command(c: wire::CommandTask) -> Result<TaskKind, ConvertError> {
    if c.argv.is_empty() {
        return Err(ConvertError::new("argv", Problem::Empty));
    }
    check_count("argv", c.argv.len(), MAX_ARGV)?;
    for (i, arg) in c.argv.iter().enumerate() {
        check_no_nul("", arg).at(&format!("argv[{i}]"))?;
    }
    if c.argv[0].is_empty() {
        return Err(ConvertError::new("argv[0]", Problem::Empty));
    }
    let env = convert_list(c.env, "env", MAX_ENV, |v| {
        check_name("name", &v.name, usize::MAX)?;
        if v.name.contains('=') {
            return Err(ConvertError::new(
                "name",
                Problem::Rule("must not contain '='"),
            ));
        }
        check_no_nul("name", &v.name)?;
        check_no_nul("value", &v.value)?;
        Ok((v.name, v.value))
    })?;
    if let Some(cwd) = &c.cwd {
        check_name("cwd", cwd, usize::MAX)?;
        check_no_nul("cwd", cwd)?;
    }
    Ok(TaskKind::Command {
        argv: c.argv,
        env,
        cwd: c.cwd,
    })
}

fn ghost(g: wire::GhostTask) -> Result<TaskKind, ConvertError> {
    check_count("creates", g.creates.len(), MAX_RESOURCES)?;
    let mut creates: Vec<(ResourceName, Capacity)> = Vec::with_capacity(g.creates.len());
    for rc in g.creates {
        let key = key_segment(&rc.name);
        let inner = || -> Result<(ResourceName, Capacity), ConvertError> {
            let name = ResourceName::new(&rc.name)?;
            let capacity = Capacity::try_from(required(rc.capacity, "capacity")?).at("capacity")?;
            Ok((name, capacity))
        };
        let (name, capacity) = inner().at(&key).at("creates")?;
        if creates.iter().any(|(n, _)| *n == name) {
            let dup = Problem::Invalid(TypeError::Duplicate(name.to_string()));
            return Err(ConvertError::new(key, dup).within("creates"));
        }
        creates.push((name, capacity));
    }
    Ok(TaskKind::Ghost {
        creates,
        ttl: g.ttl_ms.map(ms_to_duration),
    })
}

impl From<TaskState> for wire::TaskState {
    fn from(s: TaskState) -> Self {
        match s {
            TaskState::Pending => wire::TaskState::Pending,
            TaskState::Running => wire::TaskState::Running,
            TaskState::Succeeded => wire::TaskState::Succeeded,
            TaskState::Failed => wire::TaskState::Failed,
            TaskState::Cancelled => wire::TaskState::Cancelled,
        }
    }
}

/// Reads an enum field holding a `TaskState`; errors are at `field`.
pub(crate) fn task_state(value: i32, field: &str) -> Result<TaskState, ConvertError> {
    let unknown = || {
        let expected = "PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED";
        ConvertError::new(field, Problem::UnknownEnum { value, expected })
    };
    Ok(
        match wire::TaskState::try_from(value).map_err(|_| unknown())? {
            wire::TaskState::Unspecified => return Err(unknown()),
            wire::TaskState::Pending => TaskState::Pending,
            wire::TaskState::Running => TaskState::Running,
            wire::TaskState::Succeeded => TaskState::Succeeded,
            wire::TaskState::Failed => TaskState::Failed,
            wire::TaskState::Cancelled => TaskState::Cancelled,
        },
    )
}

/// The `i32` an enum field holding `state` carries.
pub(crate) fn task_state_to_wire(state: TaskState) -> i32 {
    wire::TaskState::from(state).into()
}

impl From<TaskResult> for wire::TaskResult {
    fn from(r: TaskResult) -> Self {
        let result = match r {
            TaskResult::Exited { code } => task_result::Result::ExitCode(code),
            TaskResult::Returned(bytes) => task_result::Result::Returned(bytes),
            TaskResult::Released => task_result::Result::Released(wire::Released {}),
            TaskResult::OutOfMemory {
                used_mib,
                limit_mib,
            } => task_result::Result::OutOfMemory(wire::OutOfMemory {
                used_mib,
                limit_mib,
            }),
            TaskResult::Object { size, checksum } => {
                task_result::Result::Object(wire::ResultObject { size, checksum })
            }
        };
        wire::TaskResult {
            result: Some(result),
        }
    }
}

impl TryFrom<wire::TaskResult> for TaskResult {
    type Error = ConvertError;
    fn try_from(w: wire::TaskResult) -> Result<Self, ConvertError> {
        Ok(match required(w.result, "result")? {
            task_result::Result::ExitCode(code) => TaskResult::Exited { code },
            task_result::Result::Returned(bytes) => TaskResult::Returned(super::kept(bytes)),
            task_result::Result::Released(wire::Released {}) => TaskResult::Released,
            task_result::Result::OutOfMemory(w) => TaskResult::OutOfMemory {
                used_mib: w.used_mib,
                limit_mib: w.limit_mib,
            },
            task_result::Result::Object(w) => TaskResult::Object {
                size: w.size,
                checksum: w.checksum,
            },
        })
    }
}

impl From<TaskStatus> for wire::TaskStatus {
    fn from(s: TaskStatus) -> Self {
        wire::TaskStatus {
            id: s.id.0,
            state: task_state_to_wire(s.state),
            node: s.node.map(|n| n.0),
            attempt: s.attempt,
            reason: s.reason,
            result: s.result.map(Into::into),
            evicted: s.evicted,
            finished_at_ms: s.finished_at_ms,
            hook_errors: s.hook_errors,
        }
    }
}

impl TryFrom<wire::TaskStatus> for TaskStatus {
    type Error = ConvertError;
    fn try_from(w: wire::TaskStatus) -> Result<Self, ConvertError> {
        Ok(TaskStatus {
            id: TaskId(w.id),
            state: task_state(w.state, "state")?,
            node: w.node.map(NodeId),
            attempt: w.attempt,
            reason: w.reason,
            result: convert_optional(w.result, "result")?,
            evicted: w.evicted,
            finished_at_ms: w.finished_at_ms,
            hook_errors: w.hook_errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::testutil::{round_trip, sample_specs, sample_statuses};

    #[test]
    fn every_task_kind_round_trips() {
        for spec in sample_specs() {
            round_trip::<_, wire::TaskSpec>(spec);
        }
    }

    #[test]
    fn every_status_state_and_result_round_trips() {
        for status in sample_statuses() {
            round_trip::<_, wire::TaskStatus>(status);
        }
    }

    fn command_spec(c: wire::CommandTask) -> wire::TaskSpec {
        wire::TaskSpec {
            kind: Some(task_spec::Kind::Command(c)),
            ..Default::default()
        }
    }

    fn err(w: wire::TaskSpec) -> String {
        TaskSpec::try_from(w).unwrap_err().to_string()
    }

    #[test]
    fn missing_kind_and_long_names_are_rejected() {
        assert_eq!(err(wire::TaskSpec::default()), "missing field kind");
        let argv = vec!["true".to_string()];
        let long = wire::TaskSpec {
            name: "n".repeat(MAX_TASK_NAME_BYTES + 1),
            ..command_spec(wire::CommandTask {
                argv,
                ..Default::default()
            })
        };
        assert!(err(long).starts_with("name: 257 bytes"));
    }

    #[test]
    fn command_limits() {
        let cmd = |argv: &[&str]| wire::CommandTask {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(
            err(command_spec(cmd(&[]))),
            "command.argv: must not be empty"
        );
        assert_eq!(
            err(command_spec(cmd(&[""]))),
            "command.argv[0]: must not be empty"
        );
        assert_eq!(
            err(command_spec(cmd(&["a", "b\0"]))),
            "command.argv[1]: contains a NUL byte"
        );
        let many = vec!["x"; MAX_ARGV + 1];
        assert!(err(command_spec(cmd(&many))).starts_with("command.argv: 4097 entries"));
        let env = |name: &str, value: &str| wire::CommandTask {
            env: vec![wire::EnvVar {
                name: name.into(),
                value: value.into(),
            }],
            ..cmd(&["a"])
        };
        assert_eq!(
            err(command_spec(env("", "v"))),
            "command.env[0].name: must not be empty"
        );
        assert!(err(command_spec(env("A=B", "v"))).starts_with("command.env[0].name: must"));
        assert!(err(command_spec(env("A", "\0"))).starts_with("command.env[0].value"));
        let cwd = wire::CommandTask {
            cwd: Some(String::new()),
            ..cmd(&["a"])
        };
        assert_eq!(err(command_spec(cwd)), "command.cwd: must not be empty");
    }

    #[test]
    fn function_and_ghost_errors() {
        let f = wire::TaskSpec {
            kind: Some(task_spec::Kind::Function(wire::FunctionTask::default())),
            ..Default::default()
        };
        assert_eq!(err(f), "function.name: must not be empty");
        let ghost = |creates| wire::TaskSpec {
            kind: Some(task_spec::Kind::Ghost(wire::GhostTask {
                creates,
                ttl_ms: None,
            })),
            ..Default::default()
        };
        let rc = |name: &str, capacity| wire::ResourceCapacity {
            name: name.into(),
            capacity,
        };
        let one = Some(Capacity::Finite(crate::Amount::ONE).into());
        assert_eq!(
            err(ghost(vec![rc("x", None)])),
            r#"missing field ghost.creates["x"].capacity"#
        );
        assert!(err(ghost(vec![rc("b@d", one)])).starts_with(r#"ghost.creates["b@d"]: "#));
        let twice = err(ghost(vec![rc("x", one), rc("x", one)]));
        assert!(
            twice.starts_with(r#"ghost.creates["x"]: resource "x" is listed twice"#),
            "{twice}"
        );
    }

    #[test]
    fn nested_errors_carry_the_whole_path() {
        let mut w = wire::TaskSpec::from(sample_specs().remove(0));
        w.on_success.push(wire::ResourceUpdate {
            name: "ok".into(),
            op: None,
            target: None,
        });
        assert_eq!(err(w.clone()), "missing field on_success[1].op");
        w.resources.push(wire::ResourceAmount {
            name: "b@d".into(),
            amount: 1,
        });
        assert!(err(w).starts_with(r#"resources["b@d"]: invalid resource name "b@d""#));
    }

    #[test]
    fn status_errors() {
        let w = wire::TaskStatus {
            state: 0,
            ..Default::default()
        };
        let e = TaskStatus::try_from(w).unwrap_err();
        assert_eq!(e.path(), "state");
        assert!(e.to_string().contains("unknown value 0"), "{e}");
        let w = wire::TaskStatus {
            state: 99,
            ..Default::default()
        };
        assert!(TaskStatus::try_from(w).is_err());
        let w = wire::TaskStatus {
            state: task_state_to_wire(TaskState::Succeeded),
            result: Some(wire::TaskResult { result: None }),
            ..Default::default()
        };
        assert_eq!(
            TaskStatus::try_from(w).unwrap_err().to_string(),
            "missing field result.result"
        );
    }
}
