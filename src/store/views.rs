//! Typed views: `migrate` and `serve` (at start) make one view per kind that declares
//! `columns`, with its indexes, and drop the views this daemon made that the
//! configuration no longer declares: all in one transaction, so a failure leaves the
//! views as they were. Views cost the write path nothing; each index costs the guarded
//! upsert one more index entry on its kind's rows (benches/README.md).

use std::collections::BTreeMap;

use super::Store;
use super::sql::views::{self as sql, MadeView, ViewSql};
use crate::config::Config;
use crate::db::DbError;

/// What a sync did, view by view.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ViewsReport {
    pub made: Vec<String>,
    /// Made again: their columns or indexes changed.
    pub changed: Vec<String>,
    pub kept: Vec<String>,
    pub dropped: Vec<String>,
}

impl ViewsReport {
    /// One line for `migrate` and the log; `None` when there are no views at all.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        for (what, names) in [
            ("made", &self.made),
            ("changed", &self.changed),
            ("unchanged", &self.kept),
            ("dropped", &self.dropped),
        ] {
            if !names.is_empty() {
                parts.push(format!("{what}: {}", names.join(", ")));
            }
        }
        (!parts.is_empty()).then(|| format!("typed views {}", parts.join("; ")))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ViewsError {
    #[error(
        "a table, view or index named {name:?} exists in the database and was not made by webhook-reconciler; \
         give the view of sources.{sender}.kinds.{kind} another name with view = \"...\""
    )]
    NameTaken {
        name: String,
        sender: String,
        kind: String,
    },
    #[error("making the typed views failed: {0}")]
    Db(#[from] DbError),
}

impl Store {
    /// Makes the database's typed views what `config` declares.
    pub async fn sync_views(&self, config: &Config) -> Result<ViewsReport, ViewsError> {
        let backend = self.db.backend();
        let declared: BTreeMap<String, ViewSql> = config
            .sources
            .iter()
            .flat_map(|s| {
                s.kinds.iter().filter_map(move |k| {
                    k.view
                        .as_ref()
                        .map(|v| sql::view_sql(backend, &s.name, &k.name, v))
                })
            })
            .map(|v| (v.name.clone(), v))
            .collect();
        self.db
            .write(move |conn| {
                sql::lock(conn)?;
                let made: BTreeMap<String, MadeView> = sql::made_views(conn)?
                    .into_iter()
                    .map(|m| (m.name.clone(), m))
                    .collect();
                // Before anything changes: a name someone else's object holds.
                for v in declared.values() {
                    if !made.contains_key(&v.name) && sql::name_taken(conn, &v.name)? {
                        return Ok(Err(ViewsError::NameTaken {
                            name: v.name.clone(),
                            sender: v.source.clone(),
                            kind: v.kind.clone(),
                        }));
                    }
                }
                let mut report = ViewsReport::default();
                for m in made.values() {
                    match declared.get(&m.name) {
                        None => {
                            sql::drop_view(conn, m, &[])?;
                            report.dropped.push(m.name.clone());
                        }
                        // PostgreSQL cannot replace a view with one of other columns.
                        Some(v) if v.definition != m.definition => {
                            let keep: Vec<&str> =
                                v.indexes.iter().map(|(n, _)| n.as_str()).collect();
                            sql::drop_view(conn, m, &keep)?;
                        }
                        Some(_) => {}
                    }
                }
                for v in declared.values() {
                    let before = made.get(&v.name);
                    let same = before.filter(|m| m.definition == v.definition);
                    sql::make_view(conn, v, same)?;
                    let indexes_same = same.is_some_and(|m| {
                        m.index_names()
                            .eq(v.indexes.iter().map(|(n, _)| n.as_str()))
                    });
                    match (before, indexes_same) {
                        (None, _) => report.made.push(v.name.clone()),
                        (Some(_), true) => report.kept.push(v.name.clone()),
                        (Some(_), false) => report.changed.push(v.name.clone()),
                    }
                }
                Ok(Ok(report))
            })
            .await?
    }
}
