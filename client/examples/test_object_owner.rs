//! A client for tests only: it puts objects, optionally submits tasks whose results are large,
//! prints the ids of its objects, and then lives on holding them until it is killed.
//! `tests/e2e_object_sessions.rs` SIGKILLs it to check that the objects of a client that died
//! without closing are released once its session lapses: its `put`s, and the result objects of
//! the tasks it submitted. It is not a program for users.
//!
//! `test_object_owner COUNT SIZE [TASKS LEN [GATE]]`: connects like any client (`ESCHER_HEAD`,
//! and the token found as `Client::from_env` finds it), puts `COUNT` objects of `SIZE` bytes
//! (the first opens its object session; with `COUNT` 0 it opens its session before its first
//! task with `Client::open_object_session`, as a Python driver does at `escher.init`), then
//! submits `TASKS` tasks of the function `bytes`
//! (the test worker's, `worker/examples/test_actor_worker.rs`) that each return `LEN` bytes and
//! waits for them to succeed; prints each object id on a line of its own (the results' too),
//! then `ready`, and waits for ever (its background task renewing the session meanwhile).
//! With `GATE`, the tasks are `bytes_after`, which return once the file `GATE` exists: it
//! prints the ids their results will have and does not wait for them.
//!
//! Build it with `cargo build -p escher-client --examples` (`cargo test --workspace` builds it).

use std::time::Duration;

use escher_client::{Client, Task};
use escher_proto::types::{ObjectId, TaskResult, TaskState};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (count, size, tasks, len, gate) = match &args[..] {
        [count, size] => (count, size, "0", "0", None),
        [count, size, tasks, len] => (count, size, tasks.as_str(), len.as_str(), None),
        [count, size, tasks, len, gate] => (count, size, tasks.as_str(), len.as_str(), Some(gate)),
        _ => return Err("usage: test_object_owner COUNT SIZE [TASKS LEN [GATE]]".into()),
    };
    let (count, size): (u8, usize) = (count.parse()?, size.parse()?);
    let (tasks, len): (u8, u64) = (tasks.parse()?, len.parse()?);
    let client = Client::from_env().await?;
    let mut held = Vec::new();
    if count == 0 {
        client.open_object_session().await?;
    }
    for i in 0..count {
        let object = client.put(vec![i; size]).await?;
        println!("{}", object.id());
        held.push(object);
    }
    let mut submitted = Vec::new();
    for i in 0..tasks {
        let task = match gate {
            None => Task::function_typed("bytes", &(len, i)),
            Some(gate) => Task::function_typed("bytes_after", &(len, i, gate)),
        };
        submitted.push(client.submit(task).await?);
    }
    if gate.is_some() {
        for task in &submitted {
            println!("{}", ObjectId::task_result(task.id()));
        }
        submitted.clear();
    }
    for task in submitted {
        let status = client.get(task.id(), Some(Duration::from_secs(60))).await?;
        if status.state != TaskState::Succeeded {
            return Err(format!("task {} ended {status:?}", task.id()).into());
        }
        if let Some(TaskResult::Object { .. }) = status.result {
            println!("{}", ObjectId::task_result(task.id()));
        }
    }
    println!("ready");
    std::future::pending::<()>().await;
    drop(held);
    Ok(())
}
