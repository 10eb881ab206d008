//! Measures the whole path of an object read by a task on another worker, on an embedded
//! cluster (a real head and two workers on loopback gRPC, in this process): a client puts an
//! object of MIB MiB (default 100), which lands in the first worker's store, and a function
//! that takes it as its argument runs on the second worker, whose worker brings it worker to
//! worker before the handler starts (the fetch, the seal and its check, the copy's report to
//! the head, the map; the locations come with the task's `Assign`, so no look-up). Timed from
//! the client's submit to the handler's first line, beside the same task without the argument
//! (scheduling alone), ROUNDS times (default 5), a fresh object each round. Printed: the
//! medians, and the object's size over their difference (the read's own throughput).
//!
//! Run: `cargo run --release --example object_fetch [-- MIB ROUNDS]`. With
//! `RUST_LOG=escher_worker::objects=debug` the worker logs each step (`streamed from a
//! holder`, `sealed`, `brought into this node's store`, `copy reported`) with its time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use escher::types::TaskState;
use escher::{Functions, LocalCluster, Task};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// When the handler last started, and how many argument bytes it was given.
static STARTED: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> AnyResult<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(100);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let functions = Functions::new().function("read", |ctx, _args| async move {
        let bytes: u64 = ctx.object_args().iter().map(|o| o.len()).sum();
        *STARTED.lock().unwrap() = Some((Instant::now(), bytes));
        Ok(Vec::new())
    });
    let cluster = LocalCluster::builder()
        .worker("cpu=4".parse()?)
        .worker("cpu=4,second=1".parse()?)
        .functions(functions)
        .start()
        .await?;
    let client = cluster.client().await?;
    let value: Vec<u8> = (0..mib << 20).map(|i| (i as u8).wrapping_mul(31)).collect();
    let task = || Task::function("read", Vec::new()).resources_str("cpu=1,second=1");

    // Submit to the handler's first line, with a task's outcome checked.
    async fn timed(client: &escher::Client, task: Task, bytes: u64) -> AnyResult<f64> {
        let sent = Instant::now();
        let status = client.run(task, Some(Duration::from_secs(120))).await?;
        if status.state != TaskState::Succeeded {
            return Err(format!("the task did not succeed: {status:?}").into());
        }
        let (started, given) = STARTED.lock().unwrap().take().ok_or("no start recorded")?;
        if given != bytes {
            return Err(format!("the task was given {given} bytes, not {bytes}").into());
        }
        Ok(started.duration_since(sent).as_secs_f64())
    }

    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let object = client.put(value.clone()).await?;
        let holders = client.locate_object(object.id()).await?.holders;
        without.push(timed(&client, task(), 0).await?);
        let took = timed(&client, task().object_arg(&object), value.len() as u64).await?;
        let after = client.locate_object(object.id()).await?.holders;
        println!(
            "round {round}: {:.1} ms with the argument (holders {:?} -> {:?}), {:.1} ms without",
            took * 1e3,
            holders.iter().map(|h| h.node.0).collect::<Vec<_>>(),
            after.iter().map(|h| h.node.0).collect::<Vec<_>>(),
            without[round] * 1e3
        );
        with.push(took);
        client.release_objects(&[object.id()]).await?;
        drop(object);
        // The copies go in the background: wait until the head holds none.
        while !client.list_objects().await?.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (w, wo) = (median(with), median(without));
    println!(
        "object {mib} MiB, {rounds} rounds, medians: submit to handler {:.1} ms with the \
         argument fetched from the other worker, {:.1} ms without; the read: {:.1} ms = {:.0} \
         MiB/s",
        w * 1e3,
        wo * 1e3,
        (w - wo) * 1e3,
        mib as f64 / (w - wo)
    );
    cluster.shutdown().await;
    Ok(())
}
