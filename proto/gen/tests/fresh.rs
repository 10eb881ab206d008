//! The committed gRPC code is what `proto/proto/escher.proto` generates.

#[test]
fn the_committed_grpc_code_is_what_escher_proto_generates() {
    let fresh = escher_proto_gen::fresh()
        .unwrap_or_else(|e| panic!("generating the code of proto/escher.proto failed: {e}"));
    let path = escher_proto_gen::committed();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old != fresh {
        let line = old
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| old.lines().count().min(fresh.lines().count()));
        panic!(
            "{} is not what proto/escher.proto generates (first difference at line {}); \
             refresh it with `{}` and commit it",
            path.display(),
            line + 1,
            escher_proto_gen::REFRESH
        );
    }
}
