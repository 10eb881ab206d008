//! Records the commit the binary is built from, for `--version` (see `build/commit.rs`).

include!("../build/commit.rs");

fn main() {
    emit_commit();
}
