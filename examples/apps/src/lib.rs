//! The applications of the thesis' end-to-end evaluation (§4.6.1, chapter 3), written only
//! against escher's public API. Each module is one experiment: it starts an embedded cluster
//! (a head and in-process workers over real gRPC on loopback), runs the application under
//! each placement policy, and returns what it measured. They are shared, unchanged, by the
//! examples (`cargo run --release --example NAME`), by `escher-bench` (the full-size figures)
//! and by the test suite (small sizes, the qualitative claims), so the figures and the checks
//! come from the code a reader sees.
//!
//! The lines a policy costs the application are marked with a trailing `// policy` comment,
//! and [`common::policy_lines`] counts them in the module's own source: the thesis' "2 lines"
//! (WordCount), "5 lines" (AlphaZero) and "≈ 50 lines" (EscherTune) are counted, not claimed.

pub mod alphazero;
pub mod cilantro;
pub mod common;
pub mod hfs;
pub mod tune;
pub mod wordcount;
