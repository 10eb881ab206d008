//! The function registry: the named handlers a worker can run as function tasks.
//!
//! A handler takes the task's [`TaskContext`] and its argument bytes and returns result bytes
//! or an error message. [`WorkerBuilder::function`](crate::WorkerBuilder::function) registers a
//! raw handler; [`WorkerBuilder::typed_function`](crate::WorkerBuilder::typed_function) wraps a
//! typed one with [`escher_proto::codec`] (bincode), so that clients and workers agree on the
//! encoding. Panics are caught where handlers are run (`runner.rs`), not here.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use escher_proto::codec;
use escher_proto::convert::MAX_NAME_BYTES;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::TaskContext;
use crate::error::WorkerError;

/// A boxed, sendable future, as handlers return them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a function task's handler produces: result bytes, or why it failed.
pub type FunctionResult = Result<Vec<u8>, String>;

/// A registered handler, type-erased.
pub(crate) type Handler =
    Arc<dyn Fn(TaskContext, Vec<u8>) -> BoxFuture<FunctionResult> + Send + Sync>;

/// The handlers of one worker, by name, in name order.
#[derive(Clone, Default)]
pub(crate) struct FunctionRegistry {
    handlers: BTreeMap<String, Handler>,
}

impl fmt::Debug for FunctionRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.handlers.keys()).finish()
    }
}

impl FunctionRegistry {
    /// Registers `handler` as `name`; a name is 1 to 256 bytes and registered once.
    pub(crate) fn insert(&mut self, name: String, handler: Handler) -> Result<(), WorkerError> {
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(WorkerError::config(
                "function",
                format!("a function name is 1 to {MAX_NAME_BYTES} bytes, not {name:?}"),
            ));
        }
        if self.handlers.contains_key(&name) {
            return Err(WorkerError::DuplicateFunction(name));
        }
        self.handlers.insert(name, handler);
        Ok(())
    }

    /// The handler registered as `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Handler> {
        self.handlers.get(name)
    }

    /// The registered names, in order.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.handlers.keys().map(String::as_str)
    }

    /// The error of a function task that names no registered handler.
    pub(crate) fn unknown(&self, name: &str, worker: &str) -> String {
        let registered: Vec<&str> = self.names().collect();
        let registered = if registered.is_empty() {
            "none".to_string()
        } else {
            registered.join(", ")
        };
        format!(
            "no function named {name:?} is registered on worker {worker}; registered: {registered}"
        )
    }
}

/// Wraps a raw handler.
pub(crate) fn raw<F, Fut>(f: F) -> Handler
where
    F: Fn(TaskContext, Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = FunctionResult> + Send + 'static,
{
    Arc::new(move |ctx, args| Box::pin(f(ctx, args)))
}

/// Wraps a typed handler: decodes its argument and encodes its result with the codec.
pub(crate) fn typed<A, R, F, Fut>(name: &str, f: F) -> Handler
where
    A: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
    F: Fn(TaskContext, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, String>> + Send + 'static,
{
    let f = Arc::new(f);
    let name: Arc<str> = Arc::from(name);
    Arc::new(move |ctx, args: Vec<u8>| {
        let f = Arc::clone(&f);
        let name = Arc::clone(&name);
        Box::pin(async move {
            let arg: A = codec::decode(&args).map_err(|e| {
                format!(
                    "function {name:?}: cannot decode its arguments ({} bytes): {e}; the caller \
                     must encode them with escher_proto::codec as the type the function takes",
                    args.len()
                )
            })?;
            let result = f(ctx, arg).await?;
            codec::encode(&result)
                .map_err(|e| format!("function {name:?}: cannot encode its result: {e}"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Handler {
        raw(|_ctx, args| async move { Ok(args) })
    }

    #[test]
    fn names_are_unique_and_listed() {
        let mut reg = FunctionRegistry::default();
        reg.insert("b".into(), noop()).unwrap();
        reg.insert("a".into(), noop()).unwrap();
        assert!(matches!(
            reg.insert("a".into(), noop()),
            Err(WorkerError::DuplicateFunction(n)) if n == "a"
        ));
        assert!(reg.insert(String::new(), noop()).is_err());
        assert_eq!(
            reg.unknown("c", "w1"),
            r#"no function named "c" is registered on worker w1; registered: a, b"#
        );
        assert!(
            FunctionRegistry::default()
                .unknown("c", "w")
                .ends_with("registered: none")
        );
    }
}

/// A set of named handlers and actor classes to give to several workers (every worker of a `LocalCluster`,
/// say). Cheap to clone: handlers are shared.
#[derive(Clone, Default)]
pub struct Functions {
    handlers: Vec<(String, Handler)>,
    actors: Vec<crate::actors::ActorClass>,
}

impl fmt::Debug for Functions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.handlers.iter().map(|(n, _)| n))
            .entries(self.actors.iter().map(|c| c.name()))
            .finish()
    }
}

impl Functions {
    /// No functions.
    pub fn new() -> Functions {
        Functions::default()
    }

    /// Adds a raw handler (see [`WorkerBuilder::function`](crate::WorkerBuilder::function)).
    pub fn function<F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(TaskContext, Vec<u8>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = FunctionResult> + Send + 'static,
    {
        self.handlers.push((name.into(), raw(handler)));
        self
    }

    /// Adds a typed handler (see
    /// [`WorkerBuilder::typed_function`](crate::WorkerBuilder::typed_function)).
    pub fn typed_function<A, R, F, Fut>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(TaskContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, String>> + Send + 'static,
    {
        let name = name.into();
        let handler = typed(&name, handler);
        self.handlers.push((name, handler));
        self
    }

    /// Adds an actor class (see [`WorkerBuilder::actor`](crate::WorkerBuilder::actor)).
    pub fn actor(mut self, class: crate::actors::ActorClass) -> Self {
        self.actors.push(class);
        self
    }

    /// The registered function names, in the order they were added.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.handlers.iter().map(|(n, _)| n.as_str())
    }

    pub(crate) fn actor_classes(&self) -> impl Iterator<Item = &crate::actors::ActorClass> + '_ {
        self.actors.iter()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (String, Handler)> + '_ {
        self.handlers.iter().map(|(n, h)| (n.clone(), h.clone()))
    }
}
