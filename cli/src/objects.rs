//! `escher objects`: one row per object of the head's table (docs/ARCHITECTURE.md "Objects"):
//! its id, size, owner, the nodes that hold a copy (or where its last copy was lost, and why),
//! and its namespace. An admin sees every namespace's objects; an application its own.
//!
//! Whether a copy is pinned by a reader or spilled to disk is each worker's store's to know,
//! not the head's, so it is not shown here.

use std::process::ExitCode;

use clap::Args;
use escher_proto::types::ObjectView;
use serde::Serialize;

use super::ctx::Ctx;
use super::render::table;

/// Options of `escher objects`.
#[derive(Debug, Clone, Args)]
pub struct ObjectsArgs {}

/// One row of `escher objects --json`.
#[derive(Debug, Serialize)]
pub struct ObjectRow {
    /// The object's id, `OWNER.INDEX`.
    pub id: String,
    /// Its length in bytes.
    pub size: u64,
    /// Who owns it (`session N` or `task N`).
    pub owner: String,
    /// The nodes that hold a copy.
    pub holders: Vec<u64>,
    /// Where its last copy was lost, and why, if it is lost.
    pub lost: Option<String>,
    /// Its namespace, if any.
    pub namespace: Option<String>,
}

impl ObjectRow {
    fn of(view: &ObjectView) -> ObjectRow {
        ObjectRow {
            id: view.id.to_string(),
            size: view.size,
            owner: view.owner.to_string(),
            holders: view.holders.iter().map(|h| h.node.0).collect(),
            lost: view
                .lost
                .as_ref()
                .map(|l| format!("node {}: {}", l.node, l.reason)),
            namespace: view.namespace.as_ref().map(|n| n.as_str().to_string()),
        }
    }
}

impl ObjectsArgs {
    pub(crate) async fn run(self, ctx: &mut Ctx<'_>) -> anyhow::Result<ExitCode> {
        let client = ctx.client().await?;
        let rows: Vec<ObjectRow> = client
            .list_objects()
            .await?
            .iter()
            .map(ObjectRow::of)
            .collect();
        if ctx.json {
            ctx.emit_json(&rows)?;
        } else {
            ctx.emit(&render_objects(&rows))?;
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The text of `escher objects`.
pub fn render_objects(rows: &[ObjectRow]) -> String {
    if rows.is_empty() {
        return "no objects\n".to_string();
    }
    let mut t = table(&["OBJECT", "SIZE", "OWNER", "WHERE", "NAMESPACE"]);
    for row in rows {
        let place = match &row.lost {
            Some(lost) => format!("lost ({lost})"),
            None => row
                .holders
                .iter()
                .map(|n| format!("node {n}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        t.add_row(vec![
            row.id.clone(),
            row.size.to_string(),
            row.owner.clone(),
            place,
            row.namespace.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    format!("{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_rendered_one_row_each_and_none_says_so() {
        assert_eq!(render_objects(&[]), "no objects\n");
        let live = ObjectRow {
            id: "9.0".into(),
            size: 1024,
            owner: "session 9".into(),
            holders: vec![1, 2],
            lost: None,
            namespace: Some("team-a".into()),
        };
        let lost = ObjectRow {
            id: "9.1".into(),
            size: 5,
            owner: "session 9".into(),
            holders: vec![],
            lost: Some("node 3: heartbeat timeout".into()),
            namespace: None,
        };
        let text = render_objects(&[live, lost]);
        assert!(text.contains("OBJECT") && text.contains("WHERE"), "{text}");
        assert!(
            text.contains("node 1, node 2") && text.contains("team-a"),
            "{text}"
        );
        assert!(text.contains("lost (node 3: heartbeat timeout)"), "{text}");
    }
}
