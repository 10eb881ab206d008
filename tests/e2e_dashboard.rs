//! The web dashboard (docs/DESIGN.md §11) in a real headless Chromium, driven over the DevTools
//! protocol: a head serving `--dashboard` on a loopback port, two workers (one with a simulated MIG
//! GPU), and the page checked as a person would read it: nodes with their resources as bars, the
//! task table with pending reasons, a task's attempts and output, reservations, the GPU's MIG
//! layout drawn slot by slot, the head replicas, and changes arriving live (through the watch API)
//! without a reload. A reader token sees the cluster and no task; a wrong token is asked to sign in
//! again.
//!
//! Chromium comes from Debian's `chromium` package. When it is missing the test installs it
//! with `apt-get` (which works as root, as in CI); when that cannot be done it is skipped,
//! saying why on the terminal (not in the captured output). `ESCHER_CHROMIUM` names another
//! binary; `ESCHER_SKIP_BROWSER=1` skips the test. Each view's screenshot is saved under
//! `target/tmp/dashboard/` as the test's artefact.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{cluster, free_addr, within};
use escher::types::{GangStrategy, Grant, NodeSpec, ResourceSet, Role};
use escher::{LocalCluster, Task};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long the page may take to show what a check waits for.
const PATIENCE: Duration = Duration::from_secs(20);

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn find_chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ESCHER_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .into_iter()
    .find_map(on_path)
}

/// Says `what` on the terminal even while the test harness captures output (it captures only
/// the print macros).
fn tell(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "e2e_dashboard: {what}");
}

/// The browser to drive, installed with apt-get when missing and possible; `None` when the
/// test is to be skipped (said on the terminal).
fn chromium() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            if std::env::var("ESCHER_SKIP_BROWSER").is_ok_and(|v| v == "1") {
                tell("ESCHER_SKIP_BROWSER=1: the dashboard's browser test is skipped");
                return None;
            }
            if let Some(found) = find_chromium() {
                return Some(found);
            }
            // apt-get refuses quietly enough when this is not root.
            if on_path("apt-get").is_some() {
                tell("installing Debian's chromium for the dashboard test (apt-get)");
                let install = || {
                    std::process::Command::new("apt-get")
                        .args(["install", "-y", "-q", "--no-install-recommends", "chromium"])
                        .env("DEBIAN_FRONTEND", "noninteractive")
                        .stdout(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success())
                };
                if !install() {
                    let _ = std::process::Command::new("apt-get")
                        .args(["update", "-q"])
                        .stdout(Stdio::null())
                        .status();
                    install();
                }
            }
            let found = find_chromium();
            if found.is_none() {
                tell(
                    "SKIPPED: no Chromium, and apt-get could not install one (not root, or no \
                     package source); install Debian's `chromium` package, or set \
                     ESCHER_CHROMIUM to a Chromium or Chrome binary",
                );
            }
            found
        })
        .clone()
}

/// Where the screenshots go: `target/tmp/dashboard/`.
fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A headless Chromium with one page, driven over its DevTools WebSocket.
struct Browser {
    _process: tokio::process::Child,
    _profile: tempfile::TempDir,
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Uncaught exceptions the page threw, as Chromium described them.
    exceptions: Vec<String>,
}

impl Browser {
    /// Starts Chromium and opens `url` in a page.
    async fn open(binary: &Path, url: &str) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut process = tokio::process::Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // Chromium says where its DevTools listen on stderr.
        let stderr = process.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let endpoint = within("Chromium to start", async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("Chromium exited before it listened");
                if let Some(at) = line.find("ws://") {
                    return line[at..].trim().to_string();
                }
            }
        })
        .await;
        // Keep reading what it prints, so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .expect("the DevTools WebSocket");
        let mut browser = Browser {
            _process: process,
            _profile: profile,
            socket,
            session: String::new(),
            next_id: 0,
            exceptions: Vec::new(),
        };
        let target = browser
            .send(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target = target["targetId"].as_str().unwrap().to_string();
        let attached = browser
            .send(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        browser.page("Runtime.enable", json!({})).await;
        browser.page("Page.navigate", json!({ "url": url })).await;
        browser
    }

    /// Sends one DevTools command (to the page's session when `session` is given) and returns
    /// its result, noting the page's exceptions among the events that arrive meanwhile.
    async fn send(&mut self, session: Option<String>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = session.into();
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .expect("DevTools accepts a command");
        loop {
            let frame = within(method, self.socket.next())
                .await
                .expect("the DevTools socket stays open")
                .expect("a DevTools message");
            let Message::Text(text) = frame else { continue };
            let reply: Value = serde_json::from_str(&text).unwrap();
            if reply["method"] == "Runtime.exceptionThrown" {
                let details = &reply["params"]["exceptionDetails"];
                self.exceptions.push(details.to_string());
            }
            if reply["id"] == id {
                if let Some(error) = reply.get("error") {
                    panic!("DevTools refused {method}: {error}");
                }
                return reply["result"].clone();
            }
        }
    }

    async fn page(&mut self, method: &str, params: Value) -> Value {
        let session = Some(self.session.clone());
        self.send(session, method, params).await
    }

    /// The value of the JavaScript expression `js` in the page.
    async fn eval(&mut self, js: &str) -> Value {
        let params = json!({ "expression": js, "returnByValue": true, "awaitPromise": true });
        let result = self.page("Runtime.evaluate", params).await;
        if let Some(thrown) = result.get("exceptionDetails") {
            panic!("{js}: threw {thrown}");
        }
        result["result"]["value"].clone()
    }

    /// Evaluates `js` until it returns something other than null, false, "" or 0, and returns
    /// that; fails the test after [`PATIENCE`], showing what `js` returned last.
    async fn until(&mut self, what: &str, js: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.eval(js).await;
            let truthy = match &value {
                Value::Null | Value::Bool(false) => false,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return value;
            }
            if Instant::now() > deadline {
                let page = self.eval("document.body.innerText").await;
                panic!(
                    "{what}: not within {PATIENCE:?} ({js} gave {value}); the page read:\n{page}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves what the page shows now as `name`.png among the test's artefacts.
    async fn screenshot(&mut self, name: &str) {
        let shot = self
            .page("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = BASE64
            .decode(shot["data"].as_str().expect("a screenshot"))
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = artefacts().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
    }

    /// Shows another view, as a click on its tab does.
    async fn show(&mut self, view: &str) {
        self.eval(&format!("location.hash = {}", json!(format!("#{view}"))))
            .await;
    }
}

/// The text of the first element `selector` matches, or null.
fn text_of(selector: &str) -> String {
    format!(
        "(document.querySelector({}) || {{}}).innerText || null",
        json!(selector)
    )
}

async fn dashboard_cluster() -> (LocalCluster, SocketAddr) {
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        dashboard: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within(
        "starting",
        cluster()
            .head_config(config)
            .no_workers()
            .worker_with_gpus(
                "cpu=4".parse().unwrap(),
                ["a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb"],
            )
            .worker("cpu=2".parse().unwrap())
            .start(),
    )
    .await
    .unwrap();
    (cluster, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_sees_the_cluster_its_tasks_and_gpus_live() {
    let Some(chromium) = chromium() else { return };
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    let gpu_box = cluster.nodes()[0];
    client
        .set_resource("dataset-7", 3, NodeSpec::Node(gpu_box))
        .await
        .unwrap();
    let report = format!(
        "{} report progress=0.25 progress=0.5",
        common::escher_bin().display()
    );
    let hello_script = format!("echo hello-dashboard; echo to-stderr >&2; {report}");
    let hello = client
        .submit(Task::command(["sh", "-c", hello_script.as_str()]))
        .await
        .unwrap();
    within("hello to finish", client.wait([hello.id()], 1, None))
        .await
        .unwrap();
    let stuck = client
        .submit(Task::command(["true"]).resources_str("nope=1"))
        .await
        .unwrap();

    let url = format!("http://{addr}/#token={}", cluster.admin_token());
    let mut page = Browser::open(&chromium, &url).await;

    // The overview: both nodes, their physical and ephemeral resources as bars, live.
    page.until("the token to be accepted", &text_of("#who"))
        .await;
    assert_eq!(page.eval(&text_of("#who")).await, "an admin token");
    page.until(
        "both nodes",
        "document.querySelectorAll('#nodes .node').length === 2",
    )
    .await;
    // A local cluster's workers run every task as this process's user, and say so.
    page.until(
        "each node saying its tenants are not isolated",
        "document.querySelectorAll('#nodes .node .isolation').length === 2",
    )
    .await;
    let dataset = format!(
        "[data-node=\"{}\"] [data-resource=\"dataset-7\"] .num",
        cluster_node_name(&client, gpu_box).await
    );
    page.until(
        "the dataset's bar",
        &format!("({}) === '0 / 3 (3 free)'", text_of(&dataset)),
    )
    .await;
    let mig = "[data-resource=\"mig.1g.5gb\"] .num";
    assert_eq!(page.eval(&text_of(mig)).await, "0 / 2 (2 free)");
    page.until(
        "the live feed",
        "document.querySelector('#live.on') !== null",
    )
    .await;
    page.screenshot("overview").await;
    // The token left the address bar.
    let location = page.eval("location.href").await;
    assert!(!location.as_str().unwrap().contains("token"), "{location}");

    // Live: a task submitted now shows up in the events and in the bars, with no reload.
    let slice = client
        .submit(Task::command(["sleep", "60"]).resources_str("cpu=1,mig.1g.5gb=1,dataset-7=2"))
        .await
        .unwrap();
    page.until(
        "the new task's events",
        &format!(
            "[...document.querySelectorAll('#events li')].some(li => li.innerText.includes('task {} attempt 1 started'))",
            slice.id()
        ),
    )
    .await;
    page.until(
        "the dataset in use",
        &format!("({}) === '2 / 3 (1 free)'", text_of(&dataset)),
    )
    .await;
    page.until(
        "the slice in use",
        &format!("({}) === '1 / 2 (1 free)'", text_of(mig)),
    )
    .await;

    // The task table: newest first, with the pending reason.
    page.show("tasks").await;
    page.until(
        "three rows",
        "document.querySelectorAll('#tasks tbody tr').length === 3",
    )
    .await;
    let order = page
        .eval("[...document.querySelectorAll('#tasks tbody tr')].map(r => Number(r.dataset.task))")
        .await;
    assert_eq!(
        order,
        json!([slice.id().0, stuck.id().0, hello.id().0]),
        "newest first"
    );
    let why = page
        .eval(&text_of(&format!(
            "tr[data-task=\"{}\"] .reason",
            stuck.id().0
        )))
        .await;
    assert!(why.as_str().unwrap().contains("nope"), "{why}");

    // Filtered: pending only.
    page.eval(
        "document.querySelector('#filters [name=state]').value = 'pending'; \
         document.querySelector('#filters button[type=submit]').click()",
    )
    .await;
    page.until(
        "only the pending task",
        &format!(
            "(rows => rows.length === 1 && rows[0].dataset.task === '{}')([...document.querySelectorAll('#tasks tbody tr')])",
            stuck.id().0
        ),
    )
    .await;
    page.eval("document.querySelector('#filters button[type=reset]').click()")
        .await;

    // A task's detail: its attempt and its output.
    page.show(&format!("tasks/{}", hello.id().0)).await;
    // Both streams in one condition: the detail is drawn again when the task's events arrive,
    // so a second look after the first could catch it between two drawings.
    page.until(
        "hello's output",
        &format!(
            "(({0}) === 'hello-dashboard\\n' || ({0}) === 'hello-dashboard') && \
             (({1}) || '').includes('to-stderr')",
            text_of("pre[data-stream=stdout]"),
            text_of("pre[data-stream=stderr]")
        ),
    )
    .await;
    let attempts = page
        .eval("document.querySelectorAll('#task-detail .attempts tbody tr').length")
        .await;
    assert_eq!(attempts, 1);
    // What it reported with `escher report`: the latest value of each key.
    page.until(
        "hello's telemetry",
        &format!(
            "({}) === '0.5'",
            text_of("#task-telemetry tr[data-key=progress] .latest")
        ),
    )
    .await;
    page.screenshot("task").await;

    // Live in the table: a cancelled task's badge changes in place.
    page.show("tasks").await;
    page.until(
        "the sleeping task running",
        &format!(
            "({}) === 'Running'",
            text_of(&format!("tr[data-task=\"{}\"] .state", slice.id().0))
        ),
    )
    .await;
    client.cancel([slice.id()]).await.unwrap();
    page.until(
        "the cancelled badge",
        &format!(
            "({}) === 'Cancelled'",
            text_of(&format!("tr[data-task=\"{}\"] .state", slice.id().0))
        ),
    )
    .await;

    // The GPU: four MIG instances on eight memory slots, the 3g.20gb one on slots 4 to 7.
    page.show("gpus").await;
    page.until(
        "the MIG layout",
        "document.querySelectorAll('.slot[data-profile]').length === 4",
    )
    .await;
    let big = page
        .eval("document.querySelector('.slot[data-profile=\"3g.20gb\"]').style.gridColumn")
        .await;
    assert_eq!(big, "5 / span 4");
    let holder = client
        .submit(Task::command(["sleep", "60"]).resources_str("mig.2g.10gb=1"))
        .await
        .unwrap();
    page.until(
        "the 2g.10gb slice held",
        &format!(
            "(el => el && el.classList.contains('busy') && el.innerText.includes('task {}'))(document.querySelector('.slot[data-profile=\"2g.10gb\"]'))",
            holder.id().0
        ),
    )
    .await;
    page.screenshot("gpus").await;

    // A reservation placed whole, one holder per bundle.
    let bundles: Vec<ResourceSet> = vec!["cpu=1".parse().unwrap(), "cpu=1".parse().unwrap()];
    let reservation = client
        .reserve("train", bundles, GangStrategy::StrictSpread, None)
        .await
        .unwrap();
    within("the reservation", reservation.ready(&client, None))
        .await
        .unwrap();
    page.show("reservations").await;
    page.until(
        "the reservation",
        "document.querySelectorAll('[data-reservation=\"train\"] tbody tr').length === 2",
    )
    .await;
    assert!(
        page.eval(&text_of("[data-reservation=\"train\"] h3"))
            .await
            .as_str()
            .unwrap()
            .contains("placed")
    );
    page.screenshot("reservations").await;

    // The head replicas.
    page.show("heads").await;
    page.until(
        "the leader",
        &format!("({}) || ''", text_of("[data-replica=\"1\"]")),
    )
    .await;
    assert!(
        page.eval(&text_of("[data-replica=\"1\"]"))
            .await
            .as_str()
            .unwrap()
            .contains("Leader")
    );
    page.screenshot("heads").await;

    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    client.cancel([holder.id()]).await.unwrap();
    cluster.shutdown().await;
}

/// A node's worker name, as the dashboard shows it.
async fn cluster_node_name(client: &escher::Client, node: escher::types::NodeId) -> String {
    let status = client.cluster_status().await.unwrap();
    status
        .nodes
        .iter()
        .find(|n| n.id == node)
        .map(|n| n.name.clone())
        .expect("the node is in the status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sees_the_cluster_but_no_task_and_a_bad_token_signs_in_again() {
    let Some(chromium) = chromium() else { return };
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    client.submit(Task::command(["sleep", "60"])).await.unwrap();
    let reader = client
        .create_token(
            Grant::new(Role::Reader, None).unwrap(),
            "the dashboard test",
        )
        .await
        .unwrap();

    let url = format!("http://{addr}/#token={}", reader.token);
    let mut page = Browser::open(&chromium, &url).await;
    page.until("the token to be accepted", &text_of("#who"))
        .await;
    assert_eq!(page.eval(&text_of("#who")).await, "a reader token");
    page.until(
        "both nodes",
        "document.querySelectorAll('#nodes .node').length === 2",
    )
    .await;
    page.show("tasks").await;
    let note = page
        .until("the note on tasks", &text_of("#tasks-note"))
        .await;
    assert!(note.as_str().unwrap().contains("sees no task"), "{note}");
    assert_eq!(
        page.eval("document.querySelectorAll('#tasks tbody tr').length")
            .await,
        0
    );
    page.show("gpus").await;
    page.until(
        "the MIG layout",
        "document.querySelectorAll('.slot[data-profile]').length === 4",
    )
    .await;
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);

    // A token the head does not know: the sign-in form, saying why.
    let mut wrong = Browser::open(
        &chromium,
        &format!("http://{addr}/#token=escher-admin-0000"),
    )
    .await;
    let why = wrong.until("the refusal", &text_of("#sign-in-error")).await;
    assert!(
        why.as_str().unwrap().contains("does not know the token"),
        "{why}"
    );
    assert_eq!(
        wrong.eval("document.querySelector('#main').hidden").await,
        true
    );
    cluster.shutdown().await;
}
