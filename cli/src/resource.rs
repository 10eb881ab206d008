//! `escher resource set | adjust | delete`: the ephemeral-resource API from the shell.
//!
//! Each takes exactly one target: `--local` (the node of the task the command runs in, found
//! through `ESCHER_TASK_ID`, which workers set for command tasks), `--node ID`, or
//! `--match RESOURCES [--num-nodes N]`. Each prints the ids of the nodes it changed.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use escher_proto::{Capacity, Delta, NodeId, NodeSpec, ResourceName, ResourceSet, ResourceUpdate};
use serde::Serialize;

use super::ctx::Ctx;
use escher_client::{ResourceUpdateExt, caller_task_from_env};

/// Which nodes a resource command changes: exactly one of `--local`, `--node`, `--match`.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// The selector
    #[command(flatten)]
    pub which: Which,

    /// With --match: change at most N of the matching nodes (lowest ids first)
    // Not `requires = "matching"`: clap waives a requirement that conflicts with a present
    // argument (here through the exclusive group), so `--node 1 --num-nodes 2` would pass.
    #[arg(long, value_name = "N", conflicts_with_all = ["local", "node"],
          value_parser = clap::value_parser!(u32).range(1..))]
    pub num_nodes: Option<u32>,
}

/// The node selector of [`TargetArgs`].
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// The node of the task this command runs in (only inside a task: uses ESCHER_TASK_ID)
    #[arg(long)]
    pub local: bool,

    /// Exactly this node
    #[arg(long, value_name = "ID")]
    pub node: Option<NodeId>,

    /// Every live node whose available resources contain RESOURCES (e.g. cpu=1,gpu=1)
    #[arg(long = "match", id = "matching", value_name = "RESOURCES")]
    pub matching: Option<ResourceSet>,
}

impl TargetArgs {
    /// The node spec these flags select.
    pub fn node_spec(&self) -> NodeSpec {
        match (&self.which.node, &self.which.matching) {
            (Some(id), _) => NodeSpec::Node(*id),
            (None, Some(resources)) => NodeSpec::Match {
                resources: resources.clone(),
                num_nodes: self.num_nodes,
            },
            (None, None) => NodeSpec::Local,
        }
    }
}

/// The `resource` commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ResourceCommand {
    /// Create or resize a resource to CAPACITY (4, 0.5, unbounded; 0 deletes it)
    Set {
        /// The resource (unqualified names get the namespace)
        #[arg(value_name = "NAME")]
        name: ResourceName,
        /// The new capacity: a number (4, 0.5) or `unbounded`
        #[arg(value_name = "CAPACITY")]
        capacity: Capacity,
        /// Where
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Change a resource's capacity by DELTA (+1, -2, 0.5), creating it if absent
    Adjust {
        /// The resource (unqualified names get the namespace)
        #[arg(value_name = "NAME")]
        name: ResourceName,
        /// The change: +N or -N
        #[arg(value_name = "DELTA", allow_negative_numbers = true)]
        delta: Delta,
        /// Where
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Delete a resource (tasks holding it keep it until they finish)
    Delete {
        /// The resource (unqualified names get the namespace)
        #[arg(value_name = "NAME")]
        name: ResourceName,
        /// Where
        #[command(flatten)]
        target: TargetArgs,
    },
}

/// What `escher resource ... --json` prints.
#[derive(Debug, Serialize)]
struct ResourceJson {
    nodes: Vec<NodeId>,
}

impl ResourceCommand {
    /// The update this command sends.
    pub fn update(&self) -> Result<ResourceUpdate, escher_client::ClientError> {
        match self {
            ResourceCommand::Set {
                name,
                capacity,
                target,
            } => ResourceUpdate::set(name, *capacity, target.node_spec()),
            ResourceCommand::Adjust {
                name,
                delta,
                target,
            } => ResourceUpdate::adjust(name, *delta, target.node_spec()),
            ResourceCommand::Delete { name, target } => {
                ResourceUpdate::delete(name, target.node_spec())
            }
        }
    }

    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let update = self.update()?;
        if update.target == NodeSpec::Local {
            // Refuse before connecting: outside a task, --local cannot work.
            caller_task_from_env().context("--local works only inside a running escher task")?;
        }
        let client = ctx.client().await?;
        let name = update.name.clone();
        let mut outcomes = client.set_resources(vec![update]).await?;
        let nodes = outcomes.pop().map(|o| o.nodes).unwrap_or_default();
        let deleting = matches!(self, ResourceCommand::Delete { .. });
        if ctx.json {
            ctx.emit_json(&ResourceJson { nodes })?;
        } else if deleting && nodes.is_empty() {
            ctx.emit(&format!("no targeted node has {name}; nothing deleted\n"))?;
        } else {
            ctx.emit(&render_nodes_changed(&nodes))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of a resource command: which nodes changed.
pub fn render_nodes_changed(nodes: &[NodeId]) -> String {
    if nodes.is_empty() {
        return "no node matched; nothing changed\n".to_string();
    }
    let list: Vec<String> = nodes.iter().map(ToString::to_string).collect();
    let noun = if nodes.len() == 1 { "node" } else { "nodes" };
    format!("changed {noun} {}\n", list.join(", "))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use escher_proto::CapacityOp;

    use super::*;
    use crate::{Cli, Command};

    fn command(args: &[&str]) -> ResourceCommand {
        let argv = ["escher", "resource"].iter().chain(args.iter()).copied();
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Resource(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn commands_become_updates() {
        let u = command(&["adjust", "slots", "+1", "--node", "2"])
            .update()
            .unwrap();
        assert_eq!(u.op, CapacityOp::Adjust("1".parse().unwrap()));
        assert_eq!(u.target, NodeSpec::Node(NodeId(2)));
        let u = command(&["set", "loc", "unbounded", "--match", ""])
            .update()
            .unwrap();
        assert_eq!(u.op, CapacityOp::Set(Capacity::Unbounded));
        assert!(
            matches!(u.target, NodeSpec::Match { ref resources, num_nodes: None } if resources.is_empty())
        );
        let u = command(&["delete", "lock", "--local"]).update().unwrap();
        assert_eq!((u.op, u.target), (CapacityOp::Delete, NodeSpec::Local));
    }

    #[test]
    fn changed_nodes_read_well() {
        assert_eq!(render_nodes_changed(&[NodeId(1)]), "changed node 1\n");
        assert_eq!(
            render_nodes_changed(&[NodeId(1), NodeId(4)]),
            "changed nodes 1, 4\n"
        );
        assert!(render_nodes_changed(&[]).contains("no node matched"));
    }
}
