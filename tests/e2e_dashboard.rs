//! The web dashboard (docs/DESIGN.md §11) in a real headless Chromium, driven over the DevTools
//! protocol: a head serving `--dashboard` on a loopback port, two workers (one with a simulated MIG
//! GPU and a whole one), and the page checked as a person would read it: nodes with their
//! resources as bars, the task table with pending reasons, a task's attempts and output,
//! actors (state, node, incarnation and restarts, resources, a link to their logs) and their
//! events, reservations, the GPU's MIG layout drawn slot by slot, the head replicas, and changes arriving
//! live (through the watch API) without a reload. A reader token sees the cluster and no task; a
//! wrong token is asked to sign in again. The actors view's calls column is checked without a
//! browser, through the `/api/actors` rows it draws.
//!
//! And what was found in use: seven tabs of one browser all render and stay live (one shared
//! feed, where a feed per tab would take the six connections a browser gives a host); a task's
//! detail opens where the user is, however long the list; a second link with a token leaves no
//! token in the address bar or the tab's history; a fraction of a GPU is drawn as a fraction and
//! a shrunk resource as over capacity; a pending task's detail reads as fields; the overview's
//! utilisation charts, the log browser per node and the events' timestamps. The seven tabs run
//! against real `escher-head --dashboard` and `escher-worker` processes (`procs`: the binaries
//! cargo built, which `cargo test --workspace` builds and `cargo test --test e2e_dashboard`
//! alone does not); the others against an in-process cluster.
//!
//! Chromium comes from Debian's `chromium` package. When it is missing the test installs it
//! with `apt-get` (which works as root, as in CI); when that cannot be done the tests fail,
//! saying how to provide one (`ESCHER_CHROMIUM` names another binary). Each view's screenshot
//! is saved under `target/tmp/dashboard/` as the test's artefact.

mod common;
mod procs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::{cluster, free_addr, within};
use escher::types::{GangStrategy, Grant, NodeSpec, ResourceSet, Role};
use escher::{ActorClass, LocalCluster, Task};
use futures_util::{SinkExt, StreamExt};
use procs::ProcessCluster;
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

/// The browser to drive, installed with apt-get when missing and possible; the test fails,
/// saying how to provide one, when there is none.
fn chromium() -> PathBuf {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND
        .get_or_init(|| {
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
            find_chromium()
        })
        .clone();
    found.unwrap_or_else(|| {
        panic!(
            "the dashboard's browser tests need Chromium: none is on PATH and `apt-get install \
             chromium` could not install one (not root, or no package source). Install Debian's \
             `chromium` package, or set ESCHER_CHROMIUM to a Chromium or Chrome binary"
        )
    })
}

/// Where the screenshots go: `target/tmp/dashboard/`.
fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A headless Chromium with one or more tabs, driven over its DevTools WebSocket; commands
/// go to the current tab ([`Browser::switch_to`]).
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
        browser.session = browser.new_tab(url).await;
        browser
    }

    /// Opens `url` in a new tab of the same browser (same profile, so the same connection
    /// limits and the same shared workers) and returns its session; the current tab stays.
    async fn new_tab(&mut self, url: &str) -> String {
        let target = self
            .send(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target = target["targetId"].as_str().unwrap().to_string();
        let attached = self
            .send(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await;
        let session = attached["sessionId"].as_str().unwrap().to_string();
        self.send(Some(session.clone()), "Runtime.enable", json!({}))
            .await;
        self.send(
            Some(session.clone()),
            "Page.navigate",
            json!({ "url": url }),
        )
        .await;
        session
    }

    /// Sends what follows to the tab of `session`.
    fn switch_to(&mut self, session: &str) {
        self.session = session.to_string();
    }

    /// Clicks the element `selector` matches, as a person would: scrolled into view, then
    /// clicked. Fails the test when nothing matches.
    async fn click(&mut self, selector: &str) {
        let clicked = self
            .eval(&format!(
                "(el => {{ if (!el) return false; el.scrollIntoView({{block: 'nearest'}}); \
                 el.click(); return true; }})(document.querySelector({}))",
                json!(selector)
            ))
            .await;
        assert_eq!(clicked, true, "nothing to click at {selector}");
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

/// An actor class: `Counter(start)`, whose `get()` returns the count.
fn counter() -> ActorClass {
    ActorClass::new("Counter", |_ctx, start: u64| async move { Ok(start) })
        .method("get", |n: &mut u64, (): ()| Ok(*n))
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
            .functions(common::functions().actor(counter()))
            .no_workers()
            .worker_with_gpus(
                "cpu=4".parse().unwrap(),
                ["a100-40gb:mig=3g.20gb,2g.10gb,1g.5gb,1g.5gb", "h100-80gb"],
            )
            .worker("cpu=2".parse().unwrap())
            .start(),
    )
    .await
    .unwrap();
    (cluster, addr)
}

/// `GET /api/actors` with `token`: the rows the actors view draws.
fn api_actors(addr: SocketAddr, token: &str) -> Value {
    let mut response = ureq::get(format!("http://{addr}/api/actors"))
        .header("Authorization", format!("Bearer {token}"))
        .call()
        .expect("the dashboard answers /api/actors");
    serde_json::from_str(&response.body_mut().read_to_string().expect("a text body"))
        .expect("JSON rows")
}

/// The actors view's calls column without a browser: `/api/actors` gives each running actor
/// the calls waiting at it, as its worker's heartbeats report them: several while five slow
/// calls are in flight, none once they were answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actors_api_gives_the_calls_waiting_at_each_actor() {
    let sleeper = ActorClass::new("Sleeper", |_ctx, (): ()| async move { Ok(()) }).method(
        "nap",
        |_s: &mut (), ms: u64| {
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        },
    );
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        dashboard: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within(
        "starting",
        cluster()
            .head_config(config)
            .functions(common::functions().actor(sleeper))
            .workers(1)
            .start(),
    )
    .await
    .unwrap();
    let client = within("connecting", cluster.client()).await.unwrap();
    let actor = within("an actor", client.actor(Task::actor_typed("Sleeper", &())))
        .await
        .unwrap();
    within("a call", actor.call::<u64, ()>("nap", &0))
        .await
        .unwrap();
    let token = cluster.admin_token().to_string();
    let id = actor.id().0;
    let pending = move |token: String| async move {
        tokio::task::spawn_blocking(move || api_actors(addr, &token))
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["task"]["id"] == id)
            .map(|row| row["pending_calls"].clone())
            .unwrap_or(Value::Null)
    };
    let naps: Vec<_> = (0..5)
        .map(|_| {
            let actor = actor.clone();
            tokio::spawn(async move { actor.call::<u64, ()>("nap", &1_000).await })
        })
        .collect();
    let busy = common::eventually("the API to show calls waiting", || {
        let token = token.clone();
        async move { pending(token).await.as_u64().filter(|n| *n >= 2) }
    })
    .await;
    assert!(busy <= 5, "{busy} calls waiting, of five");
    for nap in naps {
        within("a nap", nap).await.unwrap().unwrap();
    }
    common::eventually("the API to show no call waiting", || {
        let token = token.clone();
        async move { (pending(token).await.as_u64()? == 0).then_some(()) }
    })
    .await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_an_admin_sees_the_cluster_its_tasks_and_gpus_live() {
    let chromium = chromium();
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

    // An actor restarted once: its state, node, incarnation, restarts and resources, a link
    // to its logs, and its events in the overview's feed.
    let ps = within(
        "an actor",
        client.actor(
            Task::actor_typed("Counter", &3u64)
                .actor_name("ps")
                .max_restarts(2)
                .resources_str("cpu=1"),
        ),
    )
    .await
    .unwrap();
    let _: u64 = within("a call", ps.call("get", &())).await.unwrap();
    within("a restart", ps.kill(false)).await.unwrap();
    let _: u64 = within("a call after the restart", ps.call("get", &()))
        .await
        .unwrap();
    let actor_row = format!("tr[data-actor=\"{}\"]", ps.id().0);
    page.show("actors").await;
    page.until(
        "the restarted actor",
        &format!(
            "({}) === '2' && ({}) === 'Running'",
            text_of(&format!("{actor_row} [data-col=incarnation]")),
            text_of(&format!("{actor_row} [data-col=state]"))
        ),
    )
    .await;
    let row = page.eval(&text_of(&actor_row)).await;
    let row = row.as_str().unwrap();
    for cell in ["ps", "Counter", "cpu=1"] {
        assert!(row.contains(cell), "{cell} in {row}");
    }
    assert_eq!(
        page.eval(&text_of(&format!("{actor_row} [data-col=restarts]")))
            .await,
        "1"
    );
    let node = ps.describe().await.unwrap().node.unwrap();
    let logs = page
        .eval(&format!(
            "document.querySelector('{actor_row} a.actor-logs').getAttribute('href')"
        ))
        .await;
    assert_eq!(logs, format!("#logs/{}/{}", node.0, ps.id().0));
    page.screenshot("actors").await;
    page.show("overview").await;
    page.until(
        "the actor's events",
        &format!(
            "[...document.querySelectorAll('#events li[data-kind=actor]')].some(li => \
             li.innerText.includes('actor {} (ps) incarnation 2 ready'))",
            ps.id().0
        ),
    )
    .await;

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
async fn needs_browser_a_reader_sees_the_cluster_but_no_task_and_a_bad_token_signs_in_again() {
    let chromium = chromium();
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
    // No task, so no actor either: the view says why.
    page.show("actors").await;
    let note = page.until("the note on actors", &text_of("#actors")).await;
    assert!(note.as_str().unwrap().contains("sees no task"), "{note}");
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

/// The whole, non-MIG GPU's drawing in the GPU view.
const WHOLE_GPU: &str = ".slot[data-uuid]:not([data-profile])";

/// `true` when the element `selector` matches lies inside the viewport, top and bottom (to a
/// pixel); otherwise where it is, as text.
fn in_viewport(selector: &str) -> String {
    format!(
        "(el => {{ if (!el || el.closest('[hidden]')) return 'not shown'; \
         const r = el.getBoundingClientRect(); \
         return (r.height > 0 && r.top >= -1 && r.bottom <= window.innerHeight + 1) || \
           `from ${{r.top}} to ${{r.bottom}} px in a window ${{window.innerHeight}} px high`; }})\
         (document.querySelector({}))",
        json!(selector)
    )
}

/// A browser gives one host six connections. A live feed per tab held them all with six tabs
/// open, and the seventh could not even ask who its token was: here seven tabs render, each
/// is live, and each shows a task submitted afterwards, through the one feed they share; the
/// events carry the time the head committed them. Against real processes: `escher-head
/// --dashboard` and two `escher-worker`s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_seven_tabs_render_and_stay_live_on_one_shared_feed() {
    let chromium = chromium();
    let addr = free_addr();
    let cluster = ProcessCluster::builder()
        .workers(2)
        .head_args(&["--dashboard", &addr.to_string()])
        .start()
        .await;
    let client = cluster.client().await;
    let token = cluster.credentials().secret().expect("the admin token");
    let url = format!("http://{addr}/#token={token}");
    let mut browser = Browser::open(&chromium, &url).await;
    let mut tabs = vec![browser.session.clone()];
    for _ in 1..7 {
        tabs.push(browser.new_tab(&url).await);
    }
    for (n, tab) in tabs.iter().enumerate() {
        browser.switch_to(tab);
        browser
            .until(
                &format!("tab {} to render the overview", n + 1),
                "document.querySelector('#who').innerText === 'an admin token' && \
                 document.querySelectorAll('#nodes .node').length === 2",
            )
            .await;
        browser
            .until(
                &format!("tab {} to be live", n + 1),
                "document.querySelector('#live.on') !== null",
            )
            .await;
    }
    // One feed for them all: each tab reads the shared one.
    for (n, tab) in tabs.iter().enumerate() {
        browser.switch_to(tab);
        assert_eq!(
            browser
                .eval("document.querySelector('#live').dataset.feed")
                .await,
            "shared",
            "tab {} reads the shared feed",
            n + 1
        );
    }

    let task = client
        .submit(Task::command(["true"]).name("seventh-tab"))
        .await
        .unwrap();
    let submitted = format!(
        "[...document.querySelectorAll('#events li')].some(li => \
         li.innerText.includes('task {} (seventh-tab) submitted'))",
        task.id()
    );
    for (n, tab) in tabs.iter().enumerate() {
        browser.switch_to(tab);
        browser
            .until(&format!("tab {} to show the new task", n + 1), &submitted)
            .await;
    }
    // Every event says when the head committed it: a time of day, and a machine-readable
    // instant close to now.
    let stamps = browser
        .eval(
            "[...document.querySelectorAll('#events li')].map(li => { \
               const t = li.querySelector('time.at'); \
               return t && /^\\d\\d:\\d\\d:\\d\\d$/.test(t.innerText) && \
                 Math.abs(Date.parse(t.dateTime) - Date.now()) < 120000; })",
        )
        .await;
    let stamps = stamps.as_array().unwrap();
    assert!(!stamps.is_empty());
    assert!(
        stamps.iter().all(|s| *s == json!(true)),
        "each event with its time: {stamps:?}"
    );
    browser.screenshot("seventh-tab").await;
    assert!(browser.exceptions.is_empty(), "{:?}", browser.exceptions);
    drop(cluster);
}

/// With a long task list, a task's detail opens where the user is (a panel beside the list),
/// not thousands of pixels below it; a pending task's detail says why it waits as fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_a_tasks_detail_opens_in_view_and_a_pending_one_reads_as_fields() {
    let chromium = chromium();
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    let waiting = client
        .submit_batch((0..60).map(|i| {
            Task::command(["true"])
                .name(format!("waits-{i}"))
                .resources_str("nope=2")
        }))
        .await
        .unwrap();
    let (oldest, newest) = (waiting[0].id().0, waiting[59].id().0);

    let url = format!("http://{addr}/#token={}&view=tasks", cluster.admin_token());
    let mut page = Browser::open(&chromium, &url).await;
    page.until(
        "sixty rows",
        "document.querySelectorAll('#tasks tbody tr').length === 60",
    )
    .await;
    let (height, viewport) = (
        page.eval("document.documentElement.scrollHeight").await,
        page.eval("window.innerHeight").await,
    );
    assert!(
        height.as_f64().unwrap() > 1.5 * viewport.as_f64().unwrap(),
        "a list longer than the window: {height} against {viewport}"
    );

    // The first row, at the top of the page.
    page.eval("window.scrollTo(0, 0)").await;
    page.click(&format!("#tasks tr[data-task=\"{newest}\"]"))
        .await;
    page.until(
        "the newest task's detail",
        &format!("({}) === 'task {newest}'", text_of("#task-detail h3")),
    )
    .await;
    assert_eq!(
        page.eval(&in_viewport("#task-detail h3")).await,
        true,
        "the detail's heading is in view"
    );
    page.screenshot("detail-in-view").await;
    // The last row, scrolled down to.
    page.click(&format!("#tasks tr[data-task=\"{oldest}\"]"))
        .await;
    page.until(
        "the oldest task's detail",
        &format!("({}) === 'task {oldest}'", text_of("#task-detail h3")),
    )
    .await;
    assert_eq!(page.eval(&in_viewport("#task-detail h3")).await, true);
    assert_eq!(
        page.eval(&in_viewport(&format!("#tasks tr[data-task=\"{oldest}\"]")))
            .await,
        true,
        "the row clicked stays in view beside the detail"
    );

    // Pending: as fields, not JSON.
    let fields = page
        .eval(
            "Object.fromEntries([...document.querySelectorAll('#task-detail dt')].map(dt => \
             [dt.innerText, dt.nextElementSibling.innerText]))",
        )
        .await;
    assert!(
        fields["waits for"]
            .as_str()
            .is_some_and(|why| why.contains("nope")),
        "{fields}"
    );
    assert_eq!(fields["short of"], "nope: asks 2", "{fields}");
    assert_eq!(
        fields["most on a live node"], "no live node has nope",
        "{fields}"
    );
    assert_eq!(fields["requires"], "nope=2", "{fields}");
    assert!(fields.get("pending").is_none(), "{fields}");
    let detail = page.eval(&text_of("#task-detail")).await;
    let detail = detail.as_str().unwrap();
    assert!(
        !detail.contains("{\"") && !detail.contains("\":"),
        "no raw JSON: {detail}"
    );

    // Closed, the list has the width back.
    page.click("#task-detail .close").await;
    page.until(
        "the detail closed",
        "document.querySelector('#task-detail').hidden",
    )
    .await;
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    cluster.shutdown().await;
}

/// A second `escher dashboard` link pasted into an open tab (a change of the fragment only,
/// so no reload) signs the tab in with its token and leaves neither token in the address bar
/// nor in the tab's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_a_second_link_leaves_no_token_in_the_address_bar_or_history() {
    let chromium = chromium();
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    let reader = client
        .create_token(Grant::new(Role::Reader, None).unwrap(), "the second link")
        .await
        .unwrap();
    let admin = cluster.admin_token();
    let mut page = Browser::open(
        &chromium,
        &format!("http://{addr}/#token={admin}&view=gpus"),
    )
    .await;
    page.until(
        "the admin signed in",
        &format!("({}) === 'an admin token'", text_of("#who")),
    )
    .await;
    assert_eq!(page.eval("location.hash").await, "#gpus");

    page.page(
        "Page.navigate",
        json!({ "url": format!("http://{addr}/#token={}&view=heads", reader.token) }),
    )
    .await;
    page.until(
        "the reader signed in",
        &format!(
            "({}) === 'a reader token' && location.hash === '#heads'",
            text_of("#who")
        ),
    )
    .await;
    // The same document: a fragment change, not a reload.
    assert_eq!(
        page.eval("performance.getEntriesByType('navigation').length")
            .await,
        1
    );
    let href = page.eval("location.href").await;
    assert!(!href.as_str().unwrap().contains("token"), "{href}");
    assert_eq!(
        page.eval("sessionStorage.getItem('escher.token')").await,
        json!(reader.token.as_str()),
        "the token moved to the tab's storage"
    );
    let history = page.page("Page.getNavigationHistory", json!({})).await;
    let urls: Vec<&str> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["url"].as_str().unwrap())
        .collect();
    assert!(
        urls.len() >= 3,
        "about:blank, the first link, the second: {urls:?}"
    );
    for url in &urls {
        assert!(
            !url.contains("token") && !url.contains(admin) && !url.contains(&reader.token),
            "a token in the history: {urls:?}"
        );
    }
    // Back to the first link's entry: its view, with no token either.
    page.eval("history.back()").await;
    page.until("back at the GPUs", "location.hash === '#gpus'")
        .await;
    let href = page.eval("location.href").await;
    assert!(!href.as_str().unwrap().contains("token"), "{href}");
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    cluster.shutdown().await;
}

/// `escher dashboard`, as a person runs it: the real CLI prints the head's dashboard address
/// with a one-minute, single-use login ticket (`#ticket=...`), never the token.
fn dashboard_link(cluster: &LocalCluster, view: &str) -> String {
    let out = std::process::Command::new(common::escher_bin())
        .args(["dashboard", "--view", view])
        .env("ESCHER_HEAD", cluster.head_url())
        .env("ESCHER_TOKEN", cluster.admin_token())
        .env_remove("ESCHER_ACCESS_FILE")
        .env("ESCHER_HOME", "/nonexistent/escher-dashboard-test")
        .output()
        .expect("the escher CLI runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "escher dashboard: {stderr}");
    let url = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(url.contains("#ticket="), "{url}");
    assert!(!url.contains(cluster.admin_token()), "{url}");
    url
}

/// The address `escher dashboard` prints signs the page in: the ticket becomes a session of
/// the page's own (the token never reaches the browser) and leaves the address bar and the
/// history. The same address opened again is refused (a ticket works once), and so is a fresh
/// ticket presented under another `Host` than the one the head serves its dashboard at
/// (`localhost` for `127.0.0.1`, as a relay or a rebinding name would present it), which is
/// then spent for the right address too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_the_dashboards_ticket_signs_in_once_and_only_at_its_own_address() {
    let chromium = chromium();
    let addr = free_addr();
    let config = escher_head::HeadConfig {
        dashboard: Some(addr),
        ..escher_head::HeadConfig::default()
    };
    let cluster = within("starting", cluster().workers(1).head_config(config).start())
        .await
        .unwrap();
    let admin = cluster.admin_token().to_string();

    let url = dashboard_link(&cluster, "heads");
    assert!(url.starts_with(&format!("http://{addr}/#ticket=")), "{url}");
    let mut page = Browser::open(&chromium, &url).await;
    page.until(
        "the ticket to sign the page in",
        &format!(
            "({}) === 'an admin token' && location.hash === '#heads'",
            text_of("#who")
        ),
    )
    .await;
    let session = page.eval("sessionStorage.getItem('escher.token')").await;
    let session = session.as_str().expect("a session in the tab's storage");
    assert!(session.starts_with("escher-dash-"), "{session}");
    assert!(!session.contains(&admin), "{session}");
    let href = page.eval("location.href").await;
    assert!(!href.as_str().unwrap().contains("ticket"), "{href}");
    let history = page.page("Page.getNavigationHistory", json!({})).await;
    for entry in history["entries"].as_array().unwrap() {
        let seen = entry["url"].as_str().unwrap();
        assert!(!seen.contains("ticket"), "a ticket in the history: {seen}");
    }
    page.screenshot("ticket-signed-in").await;

    // The same address again, in a tab of its own (its own storage): refused, and no session.
    let again = page.new_tab(&url).await;
    page.switch_to(&again);
    page.until("the spent ticket to be refused", &text_of("#sign-in-error"))
        .await;
    let error = page.eval(&text_of("#sign-in-error")).await;
    assert!(error.as_str().unwrap().contains("already used"), "{error}");
    assert_eq!(
        page.eval("document.getElementById('main').hidden").await,
        true
    );
    assert_eq!(
        page.eval("sessionStorage.getItem('escher.token')").await,
        Value::Null
    );
    page.screenshot("ticket-spent").await;

    // A fresh ticket at another name for the same port: refused, and spent for the right one.
    let fresh = dashboard_link(&cluster, "overview");
    let elsewhere = fresh.replace(&addr.ip().to_string(), "localhost");
    assert_ne!(elsewhere, fresh);
    let wrong_host = page.new_tab(&elsewhere).await;
    page.switch_to(&wrong_host);
    page.until(
        "the ticket under another Host to be refused",
        &text_of("#sign-in-error"),
    )
    .await;
    let error = page.eval(&text_of("#sign-in-error")).await;
    assert!(error.as_str().unwrap().contains("own address"), "{error}");
    assert_eq!(
        page.eval("document.getElementById('main').hidden").await,
        true
    );
    assert_eq!(
        page.eval("sessionStorage.getItem('escher.token')").await,
        Value::Null
    );
    let at_home = page.new_tab(&fresh).await;
    page.switch_to(&at_home);
    page.until(
        "the ticket spent under the wrong Host to be refused at home too",
        &text_of("#sign-in-error"),
    )
    .await;
    let error = page.eval(&text_of("#sign-in-error")).await;
    assert!(error.as_str().unwrap().contains("already used"), "{error}");
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    cluster.shutdown().await;
}

/// Half a GPU is drawn as half of it; a resource whose capacity shrank below what a running
/// task holds (here deleted while held) is drawn as over capacity, not as an empty bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_half_a_gpu_is_drawn_as_half_and_a_shrunk_resource_as_over_capacity() {
    let chromium = chromium();
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    let gpu_box = cluster.nodes()[0];
    client
        .set_resource("dataset-9", 1, NodeSpec::Node(gpu_box))
        .await
        .unwrap();
    let half = client
        .submit(Task::command(["sleep", "60"]).resources_str("cpu=0.5,gpu=0.5"))
        .await
        .unwrap();
    let holder = client
        .submit(Task::command(["sleep", "60"]).resources_str("cpu=0.5,dataset-9=1"))
        .await
        .unwrap();
    common::running(&client, half.id()).await;
    common::running(&client, holder.id()).await;
    client
        .set_resource("dataset-9", 0, NodeSpec::Node(gpu_box))
        .await
        .unwrap();

    let url = format!("http://{addr}/#token={}", cluster.admin_token());
    let mut page = Browser::open(&chromium, &url).await;
    let name = cluster_node_name(&client, gpu_box).await;
    let dataset = format!("[data-node=\"{name}\"] [data-resource=\"dataset-9\"]");
    page.until(
        "the shrunk resource over capacity",
        &format!(
            "({}) === '1 / 0 (over capacity by 1)'",
            text_of(&format!("{dataset} .num"))
        ),
    )
    .await;
    assert_eq!(
        page.eval(&format!(
            "document.querySelector('{} .bar.over > div').style.width",
            dataset.replace('\'', "\\'")
        ))
        .await,
        "100%",
        "a full warning bar"
    );
    page.screenshot("over-capacity").await;

    page.show("gpus").await;
    page.until(
        "half of the whole GPU held",
        &format!("(el => el && el.dataset.used === '0.5')(document.querySelector('{WHOLE_GPU}'))"),
    )
    .await;
    let drawn = page
        .eval(&format!(
            "(el => ({{ busy: el.classList.contains('busy'), partial: el.classList.contains('partial'), \
             fill: (el.querySelector('.fill') || {{style: {{}}}}).style.width, text: el.innerText }}))\
             (document.querySelector('{WHOLE_GPU}'))"
        ))
        .await;
    assert_eq!(drawn["busy"], false, "not drawn as taken whole: {drawn}");
    assert_eq!(drawn["partial"], true, "{drawn}");
    assert_eq!(drawn["fill"], "50%", "{drawn}");
    assert!(
        drawn["text"].as_str().unwrap().contains("0.5 of 1 held"),
        "{drawn}"
    );
    page.screenshot("gpu-fraction").await;
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    client.cancel([half.id(), holder.id()]).await.unwrap();
    cluster.shutdown().await;
}

/// What an operator reaches for first: utilisation over time (charts from the head's own
/// history, served with the same check as the status), and from a node, the tasks that ran
/// there with their output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_the_overview_charts_utilisation_and_a_node_lists_its_tasks_with_their_output()
 {
    let chromium = chromium();
    let (cluster, addr) = dashboard_cluster().await;
    let client = cluster.client().await.unwrap();
    let (gpu_box, other) = (cluster.nodes()[0], cluster.nodes()[1]);
    client
        .set_resource("here", 1, NodeSpec::Node(other))
        .await
        .unwrap();
    let there = client
        .submit(
            Task::command(["sh", "-c", "echo out-on-other; echo err-on-other >&2"])
                .resources_str("here=1"),
        )
        .await
        .unwrap();
    let elsewhere = client
        .submit(Task::command(["echo", "out-on-gpu-box"]).resources_str("mig.1g.5gb=1"))
        .await
        .unwrap();
    within(
        "both to finish",
        client.wait([there.id(), elsewhere.id()], 2, None),
    )
    .await
    .unwrap();
    let busy = client
        .submit(Task::command(["sleep", "60"]).resources_str("cpu=1"))
        .await
        .unwrap();
    common::running(&client, busy.id()).await;

    let token = cluster.admin_token();
    let mut page = Browser::open(&chromium, &format!("http://{addr}/#token={token}")).await;
    // The history, through the same check as every other call.
    let refused = page.eval("fetch('/api/history').then(r => r.status)").await;
    assert_eq!(refused, 401);
    page.until(
        "a sample with the running task",
        &format!(
            "fetch('/api/history', {{headers: {{Authorization: 'Bearer {token}'}}}}).then(r => r.json())\
             .then(h => h.samples.length >= 2 && h.samples.some(s => s.cpu_used >= 1 && s.cpu_total === 6 \
               && s.gpu_total === 1 && s.running >= 1))"
        ),
    )
    .await;
    // The charts: CPU, memory, GPU and tasks, each a line over at least two samples.
    page.until(
        "the charts",
        "['cpu', 'memory', 'gpu', 'tasks'].every(c => { \
           const line = document.querySelector(`svg[data-chart=${c}] polyline[data-series]`); \
           return line && line.getAttribute('points').trim().split(' ').length >= 2; })",
    )
    .await;
    page.until(
        "the CPU chart's legend",
        "(document.querySelector('svg[data-chart=cpu]').parentElement.innerText || '').includes('total 6')",
    )
    .await;
    page.screenshot("charts").await;

    // From the other node's card to its tasks, then one task's output.
    let name = cluster_node_name(&client, other).await;
    page.click(&format!("[data-node=\"{name}\"] a.node-logs"))
        .await;
    page.until(
        "the node's tasks",
        &format!(
            "document.querySelector('#log-tasks tr[data-task=\"{}\"]') !== null",
            there.id().0
        ),
    )
    .await;
    assert_eq!(
        page.eval("location.hash").await,
        format!("#logs/{}", other.0)
    );
    assert_eq!(
        page.eval(&format!(
            "document.querySelector('#log-tasks tr[data-task=\"{}\"]') === null",
            elsewhere.id().0
        ))
        .await,
        true,
        "a task of another node is not listed"
    );
    page.click(&format!("#log-tasks tr[data-task=\"{}\"]", there.id().0))
        .await;
    page.until(
        "its output",
        &format!(
            "(({0}) === 'out-on-other\\n' || ({0}) === 'out-on-other') && \
             (({1}) || '').includes('err-on-other')",
            text_of("#log-detail pre[data-stream=stdout]"),
            text_of("#log-detail pre[data-stream=stderr]")
        ),
    )
    .await;
    assert_eq!(page.eval(&in_viewport("#log-detail h3")).await, true);
    page.screenshot("node-logs").await;
    // The other node lists the other task.
    page.click(&format!("[data-log-node=\"{}\"]", gpu_box.0))
        .await;
    page.until(
        "the GPU box's tasks",
        &format!(
            "document.querySelector('#log-tasks tr[data-task=\"{}\"]') !== null",
            elsewhere.id().0
        ),
    )
    .await;
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);
    client.cancel([busy.id()]).await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn needs_browser_the_policies_view_shows_each_policys_report_to_who_may_see_it() {
    use escher::types::PolicyRow;
    let chromium = chromium();
    let (cluster, addr) = dashboard_cluster().await;
    let admin = cluster.client().await.unwrap();
    let app = |ns: &str| {
        let admin = admin.clone();
        let ns = ns.to_string();
        async move {
            let grant = Grant::new(Role::App, Some(ns.parse().unwrap())).unwrap();
            admin
                .create_token(grant, "the dashboard test")
                .await
                .unwrap()
        }
    };
    let ops = app("ops").await;
    let other = app("other").await;

    // Before any report: the view says so.
    let url = format!("http://{addr}/#token={}", ops.token);
    let mut page = Browser::open(&chromium, &url).await;
    page.until("the token to be accepted", &text_of("#who"))
        .await;
    page.show("policies").await;
    let none = page
        .until("the note that nothing reported", &text_of("#policies-none"))
        .await;
    assert!(
        none.as_str().unwrap().contains("No policy has reported"),
        "{none}"
    );

    // Namespace ops reports the standing of two tenants, as fair-time does.
    let row = |name: &str, measures: &[(&str, f64)]| PolicyRow {
        row: name.to_string(),
        measures: measures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    let rows = vec![
        row(
            "heavy",
            &[("usage", 7200.0), ("factor", 0.25), ("running", 0.0)],
        ),
        row(
            "light",
            &[("usage", 0.0), ("factor", 1.0), ("running", 2.0)],
        ),
    ];
    admin
        .clone()
        .with_token(ops.token.clone())
        .report_policy("fair-time", &rows)
        .await
        .unwrap();

    // The page shows it (it refreshes the view every few seconds): a row per tenant, a
    // column per measure.
    let cell = |tenant: &str, measure: &str| {
        format!(
            "(document.querySelector('[data-policy=\"fair-time\"] tr[data-row=\"{tenant}\"] \
             td[data-measure=\"{measure}\"]') || {{}}).innerText || null"
        )
    };
    assert_eq!(
        page.until("heavy's usage", &cell("heavy", "usage")).await,
        "7200"
    );
    assert_eq!(page.eval(&cell("heavy", "factor")).await, "0.25");
    assert_eq!(page.eval(&cell("light", "running")).await, "2");
    let title = page.eval(&text_of("[data-policy=\"fair-time\"] h3")).await;
    assert!(title.as_str().unwrap().contains("namespace ops"), "{title}");
    page.screenshot("policies").await;
    assert!(page.exceptions.is_empty(), "{:?}", page.exceptions);

    // An admin sees it too; another namespace's token does not.
    let url = format!("http://{addr}/#token={}", cluster.admin_token());
    let mut admin_page = Browser::open(&chromium, &url).await;
    admin_page
        .until("the token to be accepted", &text_of("#who"))
        .await;
    admin_page.show("policies").await;
    admin_page
        .until("the admin's view of heavy", &cell("heavy", "usage"))
        .await;
    let url = format!("http://{addr}/#token={}", other.token);
    let mut other_page = Browser::open(&chromium, &url).await;
    other_page
        .until("the token to be accepted", &text_of("#who"))
        .await;
    other_page.show("policies").await;
    other_page
        .until(
            "the other namespace's empty view",
            &text_of("#policies-none"),
        )
        .await;
    assert_eq!(
        other_page
            .eval("document.querySelectorAll('[data-policy]').length")
            .await,
        0
    );
    cluster.shutdown().await;
}
