//! escher-head: the head node of an escher cluster.
//!
//! # Layout
//!
//! - [`scheduler`]: the pure scheduler core, events in and decisions out, with no I/O.
#![warn(missing_docs)]

pub mod scheduler;
