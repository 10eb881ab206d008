//! `cargo run -p escher-proto-gen`: writes escher-proto's gRPC code anew
//! (`proto/src/generated/escher.v1.rs`) from `proto/proto/escher.proto`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let code = escher_proto_gen::fresh()?;
    let path = escher_proto_gen::committed();
    std::fs::write(&path, code)?;
    println!("wrote {}", path.display());
    Ok(())
}
