//! `escher token create|list|revoke` and `escher drain NODE`: what an admin does (docs/DESIGN.md
//! §10). Both need an admin token (the access file's, on the head's machine).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use escher_proto::NodeId;
use escher_proto::types::{Grant, Labels, Role, TokenInfo, utc_seconds};

use super::ctx::Ctx;
use super::render::{lines, table};

/// The token commands.
#[derive(Debug, Clone, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (shown this once): `--role app --namespace NAME` for an
    /// application (it acts in that namespace only), `reader` for dashboards, `worker` to
    /// join workers, `admin`
    Create {
        /// What it may do: admin, app, reader or worker
        #[arg(long, value_name = "ROLE")]
        role: Role,
        /// Who or what the token is for (shown by `token list`)
        #[arg(long, default_value = "")]
        description: String,
        /// Write the token to a new credential file instead of printing it: the access
        /// file's format (0600) with this cluster's head URLs and TLS trust and this one token,
        /// for `escher-worker --access-file FILE` (a worker token) or `ESCHER_ACCESS_FILE` (the
        /// others). Give a worker on another machine this, never the admin's access file. FILE
        /// must not exist: a file or a symbolic link there (dangling or not) is refused
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
    },
    /// List every token: the access file's bootstrap ones, then created ones (revoked
    /// included); tokens themselves are never shown again, only their ids
    List,
    /// Revoke a token by its id (as `token list` shows it)
    Revoke {
        /// The token's id
        #[arg(value_name = "ID")]
        id: String,
    },
}

/// What an admin does to the head group as a whole.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Backups of the head group's state
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

/// `escher admin snapshot ...`.
#[derive(Debug, Clone, Subcommand)]
pub enum SnapshotCommand {
    /// Save the head group's whole state (tasks, results, nodes, resources, tokens) to a new
    /// file (0600), as of now: every write acknowledged before it is in it. Start a new group
    /// from it with `escher-head --restore FILE --data-dir EMPTY_DIR`
    Save {
        /// The file to write (never overwritten)
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
    },
}

impl AdminCommand {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let AdminCommand::Snapshot(SnapshotCommand::Save { file }) = self;
        let client = ctx.client().await?;
        let backup = client.backup().await?;
        let taken_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let header = escher_proto::backup::BackupHeader {
            version: escher_proto::backup::BACKUP_VERSION,
            data_format: backup.data_format,
            cluster_id: backup.cluster_id.clone(),
            revision: backup.revision,
            taken_at_ms,
            total_bytes: 0,
            sha256: String::new(),
        };
        let header = escher_proto::backup::write_backup(&file, header, &backup.image)?;
        if ctx.json {
            ctx.emit_json(&header)?;
        } else {
            ctx.emit(&format!(
                "saved the state of cluster {} at revision {} ({} bytes) to {}; start a new \
                 group from it with: escher-head --restore {} --data-dir EMPTY_DIR\n",
                header.cluster_id,
                header.revision,
                header.total_bytes,
                file.display(),
                file.display()
            ))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Options of `escher drain`.
#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// The node to drain: nothing new is admitted there, running tasks finish; it admits tasks
    /// again once its worker restarts
    #[arg(value_name = "NODE")]
    pub node: NodeId,
}

/// `escher node ...`: changes to a live node (admin).
#[derive(Debug, Clone, Subcommand)]
pub enum NodeCommand {
    /// Set labels (KEY=VALUE) and remove them (KEY-) on a live node, all or none, through the
    /// head's log; they outlive the worker's reconnections. Keys starting with `escher.` are
    /// escher's own and refused
    Label {
        /// The node
        #[arg(value_name = "NODE")]
        node: NodeId,
        /// KEY=VALUE to set, KEY- to remove
        #[arg(value_name = "KEY=VALUE|KEY-", required = true)]
        changes: Vec<String>,
    },
}

impl NodeCommand {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let NodeCommand::Label { node, changes } = self;
        let (set, remove) = parse_label_changes(&changes)?;
        let client = ctx.client().await?;
        let labels = client.label_node(node, &set, &remove).await?;
        if ctx.json {
            let map: std::collections::BTreeMap<&str, &str> = labels.iter().collect();
            ctx.emit_json(&serde_json::json!({ "node": node, "labels": map }))?;
        } else {
            let shown = if labels.is_empty() {
                "none".to_string()
            } else {
                labels.to_string()
            };
            ctx.emit(&format!("node {node} labels: {shown}\n"))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `KEY=VALUE` to set and `KEY-` to remove, as `kubectl label` spells them.
fn parse_label_changes(changes: &[String]) -> anyhow::Result<(Labels, Vec<String>)> {
    let mut set = Labels::new();
    let mut remove = Vec::new();
    for change in changes {
        if let Some((key, value)) = change.split_once('=') {
            set.insert(key, value)?;
        } else if let Some(key) = change.strip_suffix('-') {
            Labels::check_key(key)?;
            remove.push(key.to_string());
        } else {
            anyhow::bail!("{change:?} is neither KEY=VALUE (set a label) nor KEY- (remove one)");
        }
    }
    Ok((set, remove))
}

impl TokenCommand {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        match self {
            TokenCommand::Create {
                role,
                description,
                out,
            } => {
                // The global --namespace (or ESCHER_NAMESPACE) names an app token's namespace;
                // other roles have none.
                let namespace = (role == Role::App).then(|| ctx.namespace.clone()).flatten();
                let grant = Grant::new(role, namespace)?;
                if let Some(path) = &out {
                    // Refused before a token is created that no file would hold.
                    escher_proto::access::ensure_free(path)?;
                }
                let created = client.create_token(grant, description).await?;
                if let Some(path) = out {
                    let heads: Vec<String> = ctx
                        .head
                        .split(',')
                        .map(|u| u.trim().to_string())
                        .filter(|u| !u.is_empty())
                        .collect();
                    let credentials = ctx.credentials()?;
                    let trust = credentials
                        .trust()
                        .map(|(ca, name)| (ca.to_string(), name.map(str::to_string)));
                    let (admin_token, worker_token) = match role {
                        Role::Worker => (String::new(), created.token.clone()),
                        _ => (created.token.clone(), String::new()),
                    };
                    let file = escher_proto::access::AccessFile {
                        version: escher_proto::access::VERSION,
                        heads,
                        admin_token,
                        worker_token,
                        peer_token: None,
                        ca_cert: trust.as_ref().map(|(ca, _)| ca.clone()),
                        tls_name: trust.and_then(|(_, name)| name),
                        cluster: None,
                    };
                    escher_proto::access::write_credential_file(&path, &file)?;
                    ctx.emit(&format!(
                        "wrote token {} ({}) to {} (mode 0600); on the machine that uses it: {}\n",
                        created.info.id,
                        created.info.grant,
                        path.display(),
                        match role {
                            Role::Worker =>
                                format!("escher-worker --access-file {}", path.display()),
                            _ => format!("ESCHER_ACCESS_FILE={} escher ...", path.display()),
                        }
                    ))?;
                    return Ok(ExitCode::SUCCESS);
                }
                if ctx.json {
                    #[derive(serde::Serialize)]
                    struct Created<'a> {
                        token: &'a str,
                        info: &'a TokenInfo,
                    }
                    ctx.emit_json(&Created {
                        token: &created.token,
                        info: &created.info,
                    })?;
                } else {
                    ctx.emit(&format!(
                        "{}\n# token {} ({}); shown this once: give it to its user (ESCHER_TOKEN \
                         or --token)\n",
                        created.token, created.info.id, created.info.grant
                    ))?;
                }
            }
            TokenCommand::List => {
                let tokens = client.list_tokens().await?;
                if ctx.json {
                    ctx.emit_json(&tokens)?;
                } else {
                    ctx.emit(&render_tokens(&tokens))?;
                }
            }
            TokenCommand::Revoke { id } => {
                let info = client.revoke_token(id).await?;
                if ctx.json {
                    ctx.emit_json(&info)?;
                } else {
                    ctx.emit(&format!("revoked token {}\n", info.id))?;
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

impl DrainArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        client.drain(self.node).await?;
        if ctx.json {
            ctx.emit_json(&serde_json::json!({ "node": self.node, "draining": true }))?;
        } else {
            ctx.emit(&format!(
                "node {} is draining: nothing new is admitted there; running tasks finish\n",
                self.node
            ))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn render_tokens(tokens: &[TokenInfo]) -> String {
    let mut t = table(&["ID", "ROLE", "NAMESPACE", "STATE", "CREATED", "DESCRIPTION"]);
    for row in tokens.iter().map(|t| {
        let state = match t.revoked_at_ms {
            Some(at) => format!("revoked {}", utc_seconds(at)),
            None => "valid".to_string(),
        };
        let created = if t.bootstrap {
            "access file".to_string()
        } else {
            utc_seconds(t.created_at_ms)
        };
        vec![
            t.id.clone(),
            t.grant.role.to_string(),
            t.grant
                .namespace
                .as_ref()
                .map_or_else(String::new, ToString::to_string),
            state,
            created,
            t.description.clone(),
        ]
    }) {
        t.add_row(row);
    }
    lines(&t)
}
