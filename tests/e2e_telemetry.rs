//! Task telemetry end to end: a function task reports through its context, a command task
//! with `escher report` (the real CLI, with the credential its worker gave it), and a client
//! reads what they reported; only a running task may report (an ended task's credential is
//! refused), and only as itself; bad samples are refused with the field that was wrong.

mod common;

use std::time::Duration;

use escher::types::{LogStream, TaskState};
use escher::{ClientError, Functions, LocalCluster, Task};

const LIMIT: Duration = Duration::from_secs(30);

fn functions() -> Functions {
    Functions::new().typed_function("train", |ctx, steps: u32| async move {
        for i in 1..=steps {
            let mem = 1.0 + f64::from(i) * 0.5;
            ctx.report(&[("iteration", f64::from(i)), ("mem_used_gb", mem)])
                .await
                .map_err(|e| e.to_string())?;
        }
        // A bad key is refused, and says why.
        let bad = ctx.report(&[("mem used", 1.0)]).await;
        Ok::<_, String>(bad.err().map(|e| e.to_string()).unwrap_or_default())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_report_telemetry_and_clients_read_it() {
    let cluster = LocalCluster::builder()
        .workers(1)
        .functions(functions())
        .start()
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();

    let train = client
        .submit(Task::function_typed("train", &4u32))
        .await
        .unwrap()
        .id();
    let refused: String = client.get_typed(train, Some(LIMIT)).await.unwrap();
    assert!(refused.contains("telemetry key"), "{refused}");
    let got = client.telemetry([train], None).await.unwrap();
    assert_eq!(got.len(), 1);
    let t = &got[0];
    assert_eq!((t.task, t.attempt), (train, 1));
    assert_eq!(t.series("iteration"), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(t.latest("mem_used_gb"), Some(3.0));
    // Only what came after a time.
    let last = t.samples.last().unwrap().at_ms;
    assert!(
        client
            .telemetry([train], Some(last))
            .await
            .unwrap()
            .is_empty()
    );

    // A command task reports with the CLI, as itself.
    let escher = common::escher_bin();
    let script = format!(
        "{0} report progress=0.25 && {0} report progress=0.75 served=12",
        escher.display()
    );
    let cmd = client
        .submit(Task::command(["sh", "-c", script.as_str()]))
        .await
        .unwrap()
        .id();
    let status = client.get(cmd, Some(LIMIT)).await;
    assert!(status.is_ok(), "{status:?}");
    let info = client.task_info(cmd).await.unwrap();
    assert_eq!(info.status.state, TaskState::Succeeded, "{info:?}");
    let got = client.telemetry([cmd, train], None).await.unwrap();
    let c = got
        .iter()
        .find(|t| t.task == cmd)
        .expect("the command task's samples");
    assert_eq!(c.series("progress"), vec![0.25, 0.75]);
    assert_eq!(c.latest("served"), Some(12.0));

    // A credential is good only while its attempt runs: once the task ended, its token
    // reports nothing.
    let leaked = client
        .submit(Task::command([
            "sh",
            "-c",
            "printf %s \"$ESCHER_TASK_TOKEN\"",
        ]))
        .await
        .unwrap()
        .id();
    client.get(leaked, Some(LIMIT)).await.unwrap();
    let token = String::from_utf8(client.logs(leaked, LogStream::Stdout).await.unwrap()).unwrap();
    assert!(token.starts_with("escher-task-"), "{token:?}");
    let late = client.clone().with_token(token);
    let err = late.report(&[("progress", 1.0)]).await.unwrap_err();
    assert!(err.to_string().contains("succeeded"), "{err}");
    assert!(client.telemetry([leaked], None).await.unwrap().is_empty());

    // An administrator is not a task: it may read, not report.
    let err = client.report(&[("progress", 1.0)]).await.unwrap_err();
    assert!(matches!(&err, ClientError::PermissionDenied(_)), "{err:?}");
    assert!(err.to_string().contains("running tasks"), "{err}");
    // A value that is not a number never leaves the client.
    let err = client.report(&[("progress", f64::NAN)]).await.unwrap_err();
    assert!(err.to_string().contains("finite"), "{err}");
    cluster.shutdown().await;
}
