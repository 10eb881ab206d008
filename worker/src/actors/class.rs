//! [`ActorClass`]: a Rust type a worker can host as an actor, with its constructor and its
//! methods, registered with [`WorkerBuilder::actor`](crate::WorkerBuilder::actor).
//!
//! ```
//! use escher_worker::ActorClass;
//!
//! struct Counter {
//!     n: u64,
//! }
//!
//! let class = ActorClass::new("Counter", |_ctx, start: u64| async move { Ok(Counter { n: start }) })
//!     .method("add", |c: &mut Counter, by: u64| {
//!         c.n += by;
//!         Ok(c.n)
//!     })
//!     .method("get", |c: &mut Counter, (): ()| Ok(c.n));
//! assert_eq!(class.name(), "Counter");
//! ```
//!
//! Arguments and results are encoded with [`escher_proto::codec`] (bincode), as a typed
//! function's are. Methods take `&mut self` and run one at a time, in the order each caller
//! sent them, on a thread of the instance's own (so a method may block); a Rust class therefore
//! serves `max_concurrency = 1` only, and an actor asking for more fails at creation saying so.
//! A method that returns `Err` fails that call and the actor lives on; a method that panics
//! ends the incarnation (its state may be half-changed), which restarts if the actor may.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use escher_proto::codec;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::TaskContext;
use crate::functions::{BoxFuture, FunctionResult};

/// A live instance: the type-erased object and its methods.
pub(crate) type Instance = Box<dyn std::any::Any + Send>;

/// Builds an instance from the task's context and the constructor's argument bytes.
type Constructor =
    Arc<dyn Fn(TaskContext, Vec<u8>) -> BoxFuture<Result<Instance, String>> + Send + Sync>;

/// One method: takes the instance and the argument bytes.
pub(crate) type Method = Arc<dyn Fn(&mut Instance, &[u8]) -> FunctionResult + Send + Sync>;

/// An actor instance that answers calls itself, asynchronously and as many at once as it was
/// made for: the way a worker hosts an actor that lives outside its own process (a Python
/// actor's interpreter). Made by a class of [`ActorClass::dynamic`].
pub trait DynamicActor: Send + Sync + 'static {
    /// Starts a call of `method`. The host calls this in the order the calls were queued and
    /// never with more calls unanswered than the actor's `max_concurrency`; an instance starts
    /// them in the order of these calls. `Err` fails the call (the actor lives on).
    fn call(&self, method: String, args: bytes::Bytes) -> BoxFuture<Result<Vec<u8>, String>>;
    /// [`DynamicActor::call`], with the call's cancellation: `cancel` is cancelled when the
    /// caller cancels the call after it started. An instance that can stop a running call
    /// does, and fails it (an `Err` after `cancel` answers the call as cancelled); one that
    /// cannot (the default) lets it run on, and its answer is the call's.
    fn call_cancellable(
        &self,
        method: String,
        args: bytes::Bytes,
        cancel: tokio_util::sync::CancellationToken,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let _ = cancel;
        self.call(method, args)
    }
    /// Resolves, with why, when the instance ends by itself (its process exited).
    fn ended(&self) -> BoxFuture<String>;
    /// Stops the instance at once (its process killed); resolves when it has stopped.
    fn stop(&self) -> BoxFuture<()>;
}

/// Makes a dynamic instance from the task's context, the constructor's argument bytes and the
/// actor's `max_concurrency`.
pub type DynamicConstructor = Arc<
    dyn Fn(TaskContext, Vec<u8>, u32) -> BoxFuture<Result<Arc<dyn DynamicActor>, String>>
        + Send
        + Sync,
>;

/// How a class's instances are made and called.
#[derive(Clone)]
pub(crate) enum Kind {
    /// A Rust type with `&mut self` methods, on a thread of its own (one call at a time).
    Typed {
        construct: Constructor,
        methods: BTreeMap<String, Method>,
    },
    /// Instances that answer calls themselves.
    Dynamic(DynamicConstructor),
}

/// A class of actors a worker hosts: a Rust type with `&mut self` methods ([`ActorClass::new`],
/// [`ActorClass::method`]), or instances that answer calls themselves ([`ActorClass::dynamic`]).
#[derive(Clone)]
pub struct ActorClass {
    name: String,
    pub(crate) kind: Kind,
}

impl fmt::Debug for ActorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let methods: Vec<&str> = self.methods().collect();
        f.debug_struct("ActorClass")
            .field("name", &self.name)
            .field("methods", &methods)
            .finish()
    }
}

impl ActorClass {
    /// A class named `name` whose instances `construct` makes from an argument of type `A`.
    pub fn new<T, A, F, Fut>(name: impl Into<String>, construct: F) -> ActorClass
    where
        T: Send + 'static,
        A: DeserializeOwned + Send + 'static,
        F: Fn(TaskContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, String>> + Send + 'static,
    {
        let name = name.into();
        let class: Arc<str> = Arc::from(name.as_str());
        let construct = Arc::new(construct);
        let construct: Constructor = Arc::new(move |ctx, args: Vec<u8>| {
            let (construct, class) = (Arc::clone(&construct), Arc::clone(&class));
            Box::pin(async move {
                let arg: A = codec::decode(&args).map_err(|e| {
                    format!(
                        "actor class {class:?}: cannot decode the constructor's arguments \
                         ({} bytes): {e}; encode them with escher_proto::codec as the type the \
                         constructor takes",
                        args.len()
                    )
                })?;
                let instance = construct(ctx, arg).await?;
                Ok(Box::new(instance) as Instance)
            })
        });
        ActorClass {
            name,
            kind: Kind::Typed {
                construct,
                methods: BTreeMap::new(),
            },
        }
    }

    /// A class whose instances answer calls themselves ([`DynamicActor`]), made by `construct`
    /// from the task's context, the constructor's argument bytes and `max_concurrency`.
    pub fn dynamic<F>(name: impl Into<String>, construct: F) -> ActorClass
    where
        F: Fn(TaskContext, Vec<u8>, u32) -> BoxFuture<Result<Arc<dyn DynamicActor>, String>>
            + Send
            + Sync
            + 'static,
    {
        ActorClass {
            name: name.into(),
            kind: Kind::Dynamic(Arc::new(construct)),
        }
    }

    /// Adds the method `name`: `f` takes the instance and an argument of type `A`, and returns
    /// a result of type `R` or why the call failed. A later method of the same name replaces
    /// an earlier one. A [`dynamic`](Self::dynamic) class has no methods of this kind: its
    /// instances answer every call, and this does nothing.
    pub fn method<T, A, R, F>(mut self, name: impl Into<String>, f: F) -> ActorClass
    where
        T: Send + 'static,
        A: DeserializeOwned,
        R: Serialize,
        F: Fn(&mut T, A) -> Result<R, String> + Send + Sync + 'static,
    {
        let name = name.into();
        let (class, method): (Arc<str>, Arc<str>) =
            (Arc::from(self.name.as_str()), Arc::from(name.as_str()));
        let call: Method = Arc::new(move |instance: &mut Instance, args: &[u8]| {
            let this = instance.downcast_mut::<T>().ok_or_else(|| {
                format!(
                    "method {class}.{method} was registered for another type than the class's \
                     constructor makes"
                )
            })?;
            let arg: A = codec::decode(args).map_err(|e| {
                format!(
                    "{class}.{method}: cannot decode its arguments ({} bytes): {e}",
                    args.len()
                )
            })?;
            let result = f(this, arg)?;
            codec::encode(&result).map_err(|e| format!("{class}.{method}: cannot encode: {e}"))
        });
        if let Kind::Typed { methods, .. } = &mut self.kind {
            methods.insert(name, call);
        }
        self
    }

    /// The class's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The names of its methods, in order (none for a [`dynamic`](Self::dynamic) class).
    pub fn methods(&self) -> impl Iterator<Item = &str> + '_ {
        let methods = match &self.kind {
            Kind::Typed { methods, .. } => Some(methods.keys().map(String::as_str)),
            Kind::Dynamic(_) => None,
        };
        methods.into_iter().flatten()
    }

    pub(crate) fn method_named(&self, name: &str) -> Option<&Method> {
        match &self.kind {
            Kind::Typed { methods, .. } => methods.get(name),
            Kind::Dynamic(_) => None,
        }
    }

    /// The error of a call to a method this class does not have.
    pub(crate) fn unknown_method(&self, name: &str) -> String {
        let known: Vec<&str> = self.methods().collect();
        format!(
            "actor class {:?} has no method {name:?}; its methods: {}",
            self.name,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )
    }
}
