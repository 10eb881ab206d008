//! [`Network`]: hosts with addresses of their own, made of Linux network namespaces, and the
//! faults a real network has (cuts, one-way loss, loss, latency), applied inside them.
//!
//! One namespace holds a bridge; every host is a namespace of its own whose `eth0` (one end of
//! a veth pair) is plugged into that bridge, with an address in a `10.X.Y.0/24` chosen for the
//! run. The test process, in the root namespace, gets an address on the bridge too (`.254`),
//! through one more veth pair, so that its clients reach every host. Names carry the test's
//! pid, so two runs never share a namespace; everything is removed when the [`Network`] is
//! dropped (on a panic too), and a run's start removes what a killed earlier run (its pid
//! gone) left behind.
//!
//! Faults are `iptables` rules in chains of our own (`NEM-IN`, `NEM-OUT`) inside a host's
//! namespace, so healing is flushing two chains, and `tc` on the host's `eth0`. Latency and
//! loss use `netem`; a kernel without `sch_netem` (some VMs) gets loss from iptables' random
//! `statistic` match and a slow link from `tbf`, and [`Network::degrade`] says which it
//! applied.
//!
//! Every command that fails makes the test fail with the command and its error: a machine
//! without network namespaces fails the test rather than skipping it.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

/// The prefix of every namespace and interface this harness creates.
const PREFIX: &str = "nem";

/// Runs `program args`; fails with its stderr if it exits non-zero.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `args` inside namespace `ns`.
pub fn in_ns(ns: &str, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    sh("ip", &all)
}

/// One host: a namespace with one address.
#[derive(Debug, Clone)]
pub struct Host {
    /// The test's name for it (`h1`, `w2`).
    pub label: String,
    /// Its namespace.
    pub ns: String,
    /// Its address on the bridge.
    pub ip: Ipv4Addr,
}

/// How [`Network::degrade`] slowed a link down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Degrade {
    /// `tc netem` delay and loss.
    Netem,
    /// The kernel has no netem: loss from iptables, a slow link from `tbf`.
    Fallback,
}

/// The namespaces, the bridge and the root's link to it; removed on drop.
#[derive(Debug)]
pub struct Network {
    tag: String,
    subnet: [u8; 2],
    bridge_ns: String,
    root_if: String,
    hosts: Vec<Host>,
}

/// Networks made by this process so far (to keep their names apart).
static MADE: AtomicU32 = AtomicU32::new(0);

impl Network {
    /// A bridge, and the root namespace's address on it. Fails if namespaces cannot be made.
    pub fn new() -> anyhow::Result<Network> {
        remove_stale();
        let pid = std::process::id();
        let n = MADE.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{PREFIX}{pid}x{n}");
        let subnet = free_subnet(pid, n)?;
        let net = Network {
            bridge_ns: format!("{tag}-br"),
            root_if: format!("{tag}r"),
            tag,
            subnet,
            hosts: Vec::new(),
        };
        anyhow::ensure!(
            net.root_if.len() <= 15,
            "interface name {} too long",
            net.root_if
        );
        sh("ip", &["netns", "add", &net.bridge_ns])
            .context("network namespaces are needed (run as root)")?;
        in_ns(&net.bridge_ns, &["ip", "link", "set", "lo", "up"])?;
        in_ns(
            &net.bridge_ns,
            &["ip", "link", "add", "br0", "type", "bridge"],
        )?;
        in_ns(&net.bridge_ns, &["ip", "link", "set", "br0", "up"])?;
        sh(
            "ip",
            &[
                "link",
                "add",
                &net.root_if,
                "type",
                "veth",
                "peer",
                "name",
                "root-b",
            ],
        )?;
        sh("ip", &["link", "set", "root-b", "netns", &net.bridge_ns])?;
        in_ns(
            &net.bridge_ns,
            &["ip", "link", "set", "root-b", "master", "br0", "up"],
        )?;
        let root_ip = format!("{}/24", net.addr(254)); // the test's clients
        sh("ip", &["addr", "add", &root_ip, "dev", &net.root_if])?;
        sh("ip", &["link", "set", &net.root_if, "up"])?;
        // The bridge forwards between its ports whatever the host's br_netfilter says.
        let _ = in_ns(
            &net.bridge_ns,
            &["sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=0"],
        );
        Ok(net)
    }

    /// Address `.last` of this run's subnet.
    pub fn addr(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.subnet[0], self.subnet[1], last)
    }

    /// The subnet, as `10.X.Y.0/24`.
    pub fn cidr(&self) -> String {
        format!("10.{}.{}.0/24", self.subnet[0], self.subnet[1])
    }

    /// Adds host `label` at address `.last`: its namespace, its `eth0` on the bridge, its
    /// loopback, and the empty fault chains.
    pub fn add_host(&mut self, label: &str, last: u8) -> anyhow::Result<Host> {
        let host = Host {
            label: label.to_string(),
            ns: format!("{}-{label}", self.tag),
            ip: self.addr(last),
        };
        let port = format!("p-{label}");
        sh("ip", &["netns", "add", &host.ns])?;
        in_ns(&host.ns, &["ip", "link", "set", "lo", "up"])?;
        in_ns(
            &host.ns,
            &[
                "ip", "link", "add", "eth0", "type", "veth", "peer", "name", &port,
            ],
        )?;
        in_ns(
            &host.ns,
            &["ip", "link", "set", &port, "netns", &self.bridge_ns],
        )?;
        in_ns(
            &self.bridge_ns,
            &["ip", "link", "set", &port, "master", "br0", "up"],
        )?;
        let cidr = format!("{}/24", host.ip);
        in_ns(&host.ns, &["ip", "addr", "add", &cidr, "dev", "eth0"])?;
        in_ns(&host.ns, &["ip", "link", "set", "eth0", "up"])?;
        for (chain, hook) in [("NEM-IN", "INPUT"), ("NEM-OUT", "OUTPUT")] {
            in_ns(&host.ns, &["iptables", "-N", chain])?;
            in_ns(&host.ns, &["iptables", "-A", hook, "-j", chain])?;
        }
        self.hosts.push(host.clone());
        Ok(host)
    }

    /// Drops every packet between `host` and `peer`, both ways (a cut seen from both ends,
    /// enforced at `host`).
    pub fn cut(&self, host: &Host, peer: Ipv4Addr) -> anyhow::Result<()> {
        let peer = peer.to_string();
        in_ns(
            &host.ns,
            &["iptables", "-A", "NEM-IN", "-s", &peer, "-j", "DROP"],
        )?;
        in_ns(
            &host.ns,
            &["iptables", "-A", "NEM-OUT", "-d", &peer, "-j", "DROP"],
        )?;
        Ok(())
    }

    /// Drops every packet `host` sends to `peer`; what `peer` sends arrives (one-way loss).
    pub fn cut_outgoing(&self, host: &Host, peer: Ipv4Addr) -> anyhow::Result<()> {
        let peer = peer.to_string();
        in_ns(
            &host.ns,
            &["iptables", "-A", "NEM-OUT", "-d", &peer, "-j", "DROP"],
        )?;
        Ok(())
    }

    /// Cuts `host` from every other host and from the test's clients.
    pub fn isolate(&self, host: &Host) -> anyhow::Result<()> {
        let cidr = self.cidr();
        in_ns(
            &host.ns,
            &["iptables", "-A", "NEM-IN", "-s", &cidr, "-j", "DROP"],
        )?;
        in_ns(
            &host.ns,
            &["iptables", "-A", "NEM-OUT", "-d", &cidr, "-j", "DROP"],
        )?;
        Ok(())
    }

    /// Delays what `host` sends by `delay_ms` and loses `loss_pct` percent of its packets,
    /// both ways; returns how.
    pub fn degrade(&self, host: &Host, delay_ms: u32, loss_pct: u32) -> anyhow::Result<Degrade> {
        let delay = format!("{delay_ms}ms");
        let loss = format!("{loss_pct}%");
        let netem = in_ns(
            &host.ns,
            &[
                "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", &delay, "loss",
                &loss,
            ],
        );
        match netem {
            Ok(_) => Ok(Degrade::Netem),
            Err(e) if e.to_string().contains("qdisc kind is unknown") => {
                let p = format!("{:.4}", f64::from(loss_pct) / 100.0);
                for chain in ["NEM-IN", "NEM-OUT"] {
                    in_ns(
                        &host.ns,
                        &[
                            "iptables",
                            "-A",
                            chain,
                            "-m",
                            "statistic",
                            "--mode",
                            "random",
                            "--probability",
                            &p,
                            "-j",
                            "DROP",
                        ],
                    )?;
                }
                in_ns(
                    &host.ns,
                    &[
                        "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "2mbit",
                        "burst", "16kbit", "latency", &delay,
                    ],
                )?;
                Ok(Degrade::Fallback)
            }
            Err(e) => Err(e),
        }
    }

    /// Removes every fault of `host`.
    pub fn heal(&self, host: &Host) -> anyhow::Result<()> {
        in_ns(&host.ns, &["iptables", "-F", "NEM-IN"])?;
        in_ns(&host.ns, &["iptables", "-F", "NEM-OUT"])?;
        // No qdisc of ours is not an error.
        let _ = in_ns(&host.ns, &["tc", "qdisc", "del", "dev", "eth0", "root"]);
        Ok(())
    }

    /// Removes every fault of every host.
    pub fn heal_all(&self) -> anyhow::Result<()> {
        for host in &self.hosts {
            self.heal(host)?;
        }
        Ok(())
    }

    /// The pids of the processes in `host`'s namespace.
    pub fn pids(&self, host: &Host) -> Vec<i32> {
        sh("ip", &["netns", "pids", &host.ns])
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = sh("ip", &["netns", "del", &host.ns]);
        }
        let _ = sh("ip", &["netns", "del", &self.bridge_ns]);
        // Gone with its peer in the bridge's namespace; removed here in case it was not.
        let _ = sh("ip", &["link", "del", &self.root_if]);
    }
}

/// A `10.X.Y.0/24` no interface of the root namespace is on: from the pid, moved on while taken.
fn free_subnet(pid: u32, n: u32) -> anyhow::Result<[u8; 2]> {
    let taken = sh("ip", &["-4", "-o", "addr", "show"])?;
    let routes = sh("ip", &["-4", "route", "show"])?;
    for step in 0..2000u32 {
        let k = pid.wrapping_mul(7).wrapping_add(n * 131).wrapping_add(step) % (50 * 250);
        let (x, y) = (200 + (k / 250) as u8, (k % 250) as u8);
        let prefix = format!(" 10.{x}.{y}.");
        let route = format!("10.{x}.{y}.0/24");
        if !taken.contains(&prefix) && !routes.contains(&route) {
            return Ok([x, y]);
        }
    }
    bail!("no free 10.x.y.0/24 subnet for the test network")
}

/// Removes the namespaces of earlier runs of this harness whose process is gone.
fn remove_stale() {
    let Ok(list) = sh("ip", &["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh("ip", &["netns", "del", name]);
            let tag = name.split('-').next().unwrap_or(name);
            let _ = sh("ip", &["link", "del", &format!("{tag}r")]);
        }
    }
}
