//! A client for tests only: it puts objects, prints their ids, and then lives on holding them
//! until it is killed. `tests/e2e_object_sessions.rs` SIGKILLs it to check that the objects of
//! a client that died without closing are released once its session lapses. It is not a
//! program for users.
//!
//! `test_object_owner COUNT SIZE`: connects like any client (`ESCHER_HEAD`, and the token
//! found as `Client::from_env` finds it), puts `COUNT` objects of `SIZE` bytes, prints each id
//! on a line of its own, then `ready`, and waits for ever (its background task renewing the
//! session meanwhile).
//!
//! Build it with `cargo build -p escher-client --examples` (`cargo test --workspace` builds it).

use escher_client::Client;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [count, size] = &args[..] else {
        return Err("usage: test_object_owner COUNT SIZE".into());
    };
    let (count, size): (u8, usize) = (count.parse()?, size.parse()?);
    let client = Client::from_env().await?;
    let mut held = Vec::new();
    for i in 0..count {
        let object = client.put(vec![i; size]).await?;
        println!("{}", object.id());
        held.push(object);
    }
    println!("ready");
    std::future::pending::<()>().await;
    drop(held);
    Ok(())
}
