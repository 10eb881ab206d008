//! `escher heads`: every replica of the head group (role, term, commit and applied index, data
//! format, reachable or not), and `escher heads add ID=HOST:PORT` / `escher heads remove ID`, the raft
//! membership changes an operator uses to replace a machine.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use escher_proto::types::HeadsReply;

use super::ctx::Ctx;
use super::render::{lines, table};

/// Options of `escher heads`.
#[derive(Debug, Clone, Args)]
pub struct HeadsArgs {
    /// Change the group (without one: show it)
    #[command(subcommand)]
    pub change: Option<HeadsChange>,
}

/// The membership changes of `escher heads`.
#[derive(Debug, Clone, Subcommand)]
pub enum HeadsChange {
    /// Add a replica: start it first with `escher-head --id ID --join --group GROUP --listen
    /// HOST:PORT`; it catches up from a snapshot of the leader
    Add {
        /// The new replica, as ID=HOST:PORT (the address the other replicas reach it at)
        #[arg(value_name = "ID=HOST:PORT", value_parser = parse_replica)]
        replica: (u64, String),
    },
    /// Remove a replica (stop its process afterwards)
    Remove {
        /// Its replica id
        #[arg(value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
        id: u64,
    },
}

fn parse_replica(text: &str) -> Result<(u64, String), String> {
    let (id, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| format!("{id:?} is not a replica id (a number from 1)"))?;
    let address = address.trim();
    if !escher_proto::convert::is_host_port(address) {
        return Err(format!("{address:?} is not HOST:PORT"));
    }
    Ok((id, address.to_string()))
}

impl HeadsArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let heads = match self.change {
            None => client.heads().await?,
            Some(HeadsChange::Add {
                replica: (id, address),
            }) => client.add_head(id, address).await?,
            Some(HeadsChange::Remove { id }) => client.remove_head(id).await?,
        };
        if ctx.json {
            ctx.emit_json(&heads)?;
        } else {
            ctx.emit(&render_heads(&heads))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// A replica's data formats (DESIGN §14): the one it writes, and the newest it reads where that
/// is newer (a group part-way through an upgrade writes the older one).
fn data_format(r: &escher_proto::types::HeadReplica) -> String {
    match (r.writes_data_format, r.data_format) {
        (Some(writes), Some(reads)) if reads > writes => format!("{writes} (reads {reads})"),
        (Some(writes), _) => writes.to_string(),
        (None, _) => "-".into(),
    }
}

/// The text of `escher heads` (and of the head section of `escher status`).
pub fn render_heads(heads: &HeadsReply) -> String {
    let leader = heads.leader().map(|r| r.id);
    let mut out = match leader {
        Some(id) => format!(
            "head group {}: {} replica(s), replica {id} leads\n",
            heads.group,
            heads.replicas.len()
        ),
        None => format!(
            "head group {}: {} replica(s), no leader (an election, or too few replicas up)\n",
            heads.group,
            heads.replicas.len()
        ),
    };
    let mut t = table(&[
        "ID",
        "ADDRESS",
        "ROLE",
        "TERM",
        "COMMIT",
        "APPLIED",
        "FORMAT",
        "REACHABLE",
        "NOTE",
    ]);
    for r in &heads.replicas {
        let note = match (&r.error, &r.stalled, r.in_memory) {
            (Some(e), _, _) => e.clone(),
            (None, Some(why), _) => format!("stalled: {why}"),
            (None, None, true) => "log in memory only".to_string(),
            (None, None, false) => String::new(),
        };
        let known = |n: u64| {
            if r.reachable {
                n.to_string()
            } else {
                "-".into()
            }
        };
        t.add_row(vec![
            r.id.to_string(),
            r.address.clone(),
            r.role
                .map_or_else(|| "-".to_string(), |role| role.to_string()),
            known(r.term),
            known(r.commit_index),
            known(r.applied_index),
            data_format(r),
            if r.reachable { "yes" } else { "no" }.to_string(),
            note,
        ]);
    }
    out.push_str(&lines(&t));
    out
}

#[cfg(test)]
mod tests {
    use escher_proto::types::{HeadReplica, ReplicaRole};

    use super::*;

    #[test]
    fn replicas_read_as_a_table() {
        let replica = |id: u64, role: Option<ReplicaRole>| HeadReplica {
            id,
            address: format!("10.0.0.{id}:7600"),
            role,
            term: 3,
            commit_index: 17,
            applied_index: 17,
            reachable: role.is_some(),
            error: role.is_none().then(|| "connection refused".to_string()),
            leader: Some(1),
            in_memory: false,
            data_format: role.map(|_| 1),
            writes_data_format: role.map(|_| 1),
            stalled: None,
        };
        let heads = HeadsReply {
            group: "g".into(),
            replicas: vec![
                replica(1, Some(ReplicaRole::Leader)),
                replica(2, Some(ReplicaRole::Follower)),
                replica(3, None),
            ],
        };
        let text = render_heads(&heads);
        assert!(
            text.starts_with("head group g: 3 replica(s), replica 1 leads"),
            "{text}"
        );
        assert!(
            text.contains("leader") && text.contains("follower"),
            "{text}"
        );
        assert!(text.contains("connection refused"), "{text}");
        // A leader whose disk filled says so until another is elected, and is not the one
        // named as leading once another leads.
        let mut stalled = heads.clone();
        stalled.replicas[0].stalled = Some(
            "the disk of replica 1's raft log (/var/lib/escher/head) has been full for 2.5s".into(),
        );
        stalled.replicas[1].role = Some(ReplicaRole::Leader);
        stalled.replicas[1].term = 4;
        let text = render_heads(&stalled);
        assert!(text.contains("replica 2 leads"), "{text}");
        assert!(
            text.contains("stalled: the disk of replica 1's raft log (/var/lib/escher/head) has been full for 2.5s"),
            "{text}"
        );
        assert_eq!(
            parse_replica("4=10.0.0.4:7600").unwrap(),
            (4, "10.0.0.4:7600".into())
        );
        assert!(parse_replica("0=h:1").is_err());
        assert!(parse_replica("4=http://h:1").is_err());
    }
}
