//! escher-esl: scheduling libraries (ESLs).
//!
//! Every policy of the ESCHER thesis (locality, anti-affinity, gang, DAG ordering, queues, soft
//! constraints, hierarchical fair sharing, ...) built only on the public client API, each in
//! its own module.
#![warn(missing_docs)]
