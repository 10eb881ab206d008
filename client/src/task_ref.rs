//! [`TaskRef`] and [`TypedTaskRef`]: handles to submitted tasks.
//!
//! A `TaskRef` is what `submit` returns: the id the head assigned, plus what the client
//! already knows about the task (its name and kind), so that callers need not keep the spec
//! around. Every method that takes a task accepts a `TaskRef`, a `&TaskRef` or a bare
//! [`TaskId`] (through `Into<TaskId>`).
//!
//! A `TypedTaskRef<R>` also remembers the type of a function task's result, so that
//! `handle.get(&client, None).await?` returns an `R`.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use escher_proto::{TaskId, TaskKind, TaskSpec};
use serde::de::DeserializeOwned;

use crate::{Client, ClientError};

/// Which of the three kinds of task a handle refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskKindTag {
    /// A child process.
    Command,
    /// A registered function.
    Function,
    /// A ghost task.
    Ghost,
    /// An actor.
    Actor,
}

impl TaskKindTag {
    /// The kind of `kind`.
    pub fn of(kind: &TaskKind) -> TaskKindTag {
        match kind {
            TaskKind::Command { .. } => TaskKindTag::Command,
            TaskKind::Function { .. } => TaskKindTag::Function,
            TaskKind::Ghost { .. } => TaskKindTag::Ghost,
            TaskKind::Actor(_) => TaskKindTag::Actor,
        }
    }

    /// `command`, `function`, `ghost` or `actor`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKindTag::Command => "command",
            TaskKindTag::Function => "function",
            TaskKindTag::Ghost => "ghost",
            TaskKindTag::Actor => "actor",
        }
    }
}

impl fmt::Display for TaskKindTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A submitted task: its id and what the client knows about it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskRef {
    id: TaskId,
    name: String,
    kind: TaskKindTag,
}

impl TaskRef {
    /// The handle of the task with this `id`, submitted as `spec`.
    pub fn new(id: TaskId, spec: &TaskSpec) -> TaskRef {
        TaskRef {
            id,
            name: spec.name.clone(),
            kind: TaskKindTag::of(&spec.kind),
        }
    }

    /// The same handle for the task the head numbered `id`.
    pub(crate) fn with_id(mut self, id: TaskId) -> TaskRef {
        self.id = id;
        self
    }

    /// The id the head assigned.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The task's kind.
    pub fn kind(&self) -> TaskKindTag {
        self.kind
    }

    /// The same handle, typed with the result `R` of a function task.
    pub fn typed<R: DeserializeOwned>(self) -> TypedTaskRef<R> {
        TypedTaskRef {
            task: self,
            result: PhantomData,
        }
    }
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} {:?})", self.id, self.kind, self.name)
    }
}

impl From<TaskRef> for TaskId {
    fn from(t: TaskRef) -> TaskId {
        t.id
    }
}

impl From<&TaskRef> for TaskId {
    fn from(t: &TaskRef) -> TaskId {
        t.id
    }
}

/// A function task whose handler returns an `R` (bincode-encoded).
pub struct TypedTaskRef<R> {
    task: TaskRef,
    result: PhantomData<fn() -> R>,
}

impl<R> TypedTaskRef<R> {
    /// The untyped handle.
    pub fn task(&self) -> &TaskRef {
        &self.task
    }

    /// The id the head assigned.
    pub fn id(&self) -> TaskId {
        self.task.id
    }
}

impl<R: DeserializeOwned> TypedTaskRef<R> {
    /// Waits for the task (at most `timeout`, or without limit) and decodes its result; see
    /// [`Client::get_typed`].
    pub async fn get(&self, client: &Client, timeout: Option<Duration>) -> Result<R, ClientError> {
        client.get_typed(self.task.id, timeout).await
    }
}

impl<R> fmt::Debug for TypedTaskRef<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedTaskRef")
            .field("task", &self.task)
            .field("result", &std::any::type_name::<R>())
            .finish()
    }
}

impl<R> Clone for TypedTaskRef<R> {
    fn clone(&self) -> Self {
        TypedTaskRef {
            task: self.task.clone(),
            result: PhantomData,
        }
    }
}

impl<R> From<TypedTaskRef<R>> for TaskId {
    fn from(t: TypedTaskRef<R>) -> TaskId {
        t.task.id
    }
}

impl<R> From<&TypedTaskRef<R>> for TaskId {
    fn from(t: &TypedTaskRef<R>) -> TaskId {
        t.task.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Task;

    #[test]
    fn handles_carry_id_name_and_kind() {
        let spec = Task::function_typed("add", &(1u8, 2u8)).build().unwrap();
        let t = TaskRef::new(TaskId(7), &spec);
        assert_eq!(t.id(), TaskId(7));
        assert_eq!(t.name(), "add");
        assert_eq!(t.kind(), TaskKindTag::Function);
        assert_eq!(t.to_string(), r#"7 (function "add")"#);
        assert_eq!(TaskId::from(&t), TaskId(7));
        let typed = t.typed::<u8>();
        assert_eq!(TaskId::from(&typed), TaskId(7));
        assert!(format!("{typed:?}").contains("u8"));
    }
}
