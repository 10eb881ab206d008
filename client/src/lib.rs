//! escher-client: the application's way into a cluster.
//!
//! It will hold the async client, its blocking wrapper, the task-spec builders and the `escher`
//! command-line tool.
#![warn(missing_docs)]
