//! Validation of a kind's typed view: `columns`, `indexes` and `view`. What passes here
//! reaches SQL only as identifiers that are checked and as quoted literals
//! (`store::sql::views`).

use super::Checker;
use crate::config::raw::{RawColumn, RawKind};
use crate::config::types::{Column, ColumnType, FIXED_VIEW_COLUMNS, TimeFormat, TypedView};

/// The tables the migrations make (a view must not take one of their names); the list is
/// checked against `migrations/` by `tests/it/structure.rs`.
pub const OUR_TABLES: &[&str] = &[
    "accounts",
    "change_pending",
    "change_seq",
    "changes",
    "consumer_positions",
    "consumer_skips",
    "dead_letters",
    "pending_fetches",
    "processed_events",
    "prune_runs",
    "reconcile_checkpoints",
    "reconcile_due",
    "reconcile_last_success",
    "reconcile_leases",
    "reconcile_paused",
    "reconcile_runs",
    "reconcile_state",
    "resources",
    "typed_views",
];

/// PostgreSQL's longest identifier.
const MAX_IDENTIFIER: usize = 63;

/// Lowercase so that PostgreSQL's folding of unquoted names never changes which column a
/// query names.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= MAX_IDENTIFIER
}

const IDENTIFIER_RULE: &str =
    "lowercase letters, digits and _ (not a digit first), at most 63 characters";

/// `SOURCE_KIND`, lowercased, anything but letters and digits as `_`.
fn default_view_name(source: &str, kind: &str) -> String {
    let mut name: String = format!("{source}_{kind}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// The kind's view, or `None` when it declares no column and names no view.
pub(super) fn validate_view(
    c: &mut Checker,
    source: &str,
    kind: &str,
    raw: &RawKind,
) -> Option<TypedView> {
    let base = format!("sources.{source}.kinds.{kind}");
    let mut columns = Vec::new();
    let mut off = Vec::new();
    for (name, column) in &raw.columns {
        let key = format!("{base}.columns.{name}");
        let (pointer, ty, format) = match column {
            RawColumn::Off(_) => {
                off.push(name.as_str());
                continue;
            }
            RawColumn::Pointer(p) => (p.as_str(), None, None),
            RawColumn::Typed(t) => (t.pointer.as_str(), t.ty.as_deref(), t.format.as_deref()),
        };
        if !is_identifier(name) {
            c.fail(
                &key,
                format!("{name:?} is not a column name here: use {IDENTIFIER_RULE}"),
            );
            continue;
        }
        if FIXED_VIEW_COLUMNS.contains(&name.as_str()) {
            c.fail(
                &key,
                format!(
                    "{name:?} is one of the view's fixed columns ({}); name the column otherwise, e.g. \"state_{name}\"",
                    FIXED_VIEW_COLUMNS.join(", ")
                ),
            );
            continue;
        }
        let Some(path) = pointer_path(c, &key, pointer) else {
            continue;
        };
        let time_format = match format {
            None => None,
            Some("unix") => Some(TimeFormat::Unix),
            Some("unix_ms") => Some(TimeFormat::UnixMs),
            Some("rfc3339") => Some(TimeFormat::Rfc3339),
            Some(other) => {
                c.fail(
                    format!("{key}.format"),
                    format!("{other:?} is not a timestamp format; use unix, unix_ms or rfc3339"),
                );
                continue;
            }
        };
        let ty = match ty.unwrap_or("text") {
            "text" => ColumnType::Text,
            "bigint" => ColumnType::Bigint,
            "numeric" => ColumnType::Numeric,
            "boolean" => ColumnType::Boolean,
            "timestamptz" => ColumnType::Timestamptz(time_format.unwrap_or(TimeFormat::Rfc3339)),
            other => {
                c.fail(
                    format!("{key}.type"),
                    format!(
                        "{other:?} is not a column type; use text, bigint, numeric, boolean or timestamptz"
                    ),
                );
                continue;
            }
        };
        if time_format.is_some() && !matches!(ty, ColumnType::Timestamptz(_)) {
            c.fail(
                format!("{key}.format"),
                "is for timestamptz columns; remove it, or set type = \"timestamptz\"",
            );
            continue;
        }
        columns.push(Column {
            name: name.clone(),
            path,
            ty,
        });
    }
    let mut indexes: Vec<String> = Vec::new();
    for (i, name) in raw.indexes.iter().flatten().enumerate() {
        if indexes.contains(name) {
            continue;
        }
        if columns.iter().any(|col| &col.name == name) {
            indexes.push(name.clone());
        } else if !off.contains(&name.as_str()) {
            // An index on a column switched off goes with it (a preset's, mostly).
            c.fail(
                format!("{base}.indexes[{i}]"),
                format!("{name:?} is not a column of this kind; index one of its `columns`"),
            );
        }
    }
    if columns.is_empty() && raw.view.is_none() {
        return None;
    }
    let name = match &raw.view {
        Some(v) if !is_identifier(v) => {
            c.fail(
                format!("{base}.view"),
                format!("{v:?} is not a view name here: use {IDENTIFIER_RULE}"),
            );
            return None;
        }
        Some(v) => v.clone(),
        None => {
            let name = default_view_name(source, kind);
            if name.len() > MAX_IDENTIFIER {
                c.fail(
                    format!("{base}.view"),
                    format!("the default name {name:?} is longer than 63 characters; name the view with view = \"...\""),
                );
                return None;
            }
            name
        }
    };
    if OUR_TABLES.contains(&name.as_str())
        || name.starts_with("pg_")
        || name.starts_with("sqlite_")
        || name.starts_with("__diesel")
    {
        c.fail(
            format!("{base}.view"),
            format!("{name:?} is the name of a table of the database; name the view otherwise with view = \"...\""),
        );
        return None;
    }
    Some(TypedView {
        name,
        columns,
        indexes,
    })
}

/// A pointer's segments, unescaped. SQLite's JSON paths cannot hold a double quote in a
/// key, so a pointer with one is refused on both backends rather than read differently.
fn pointer_path(c: &mut Checker, key: &str, pointer: &str) -> Option<Vec<String>> {
    let Some(rest) = pointer.strip_prefix('/') else {
        c.fail(
            key,
            format!("{pointer:?} is not a JSON pointer; it starts with '/', e.g. \"/status\" or \"/customer/email\""),
        );
        return None;
    };
    if pointer.contains('"') || pointer.chars().any(char::is_control) {
        c.fail(
            key,
            format!("{pointer:?} holds a double quote or a control character, which a view cannot read on SQLite"),
        );
        return None;
    }
    Some(
        rest.split('/')
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect(),
    )
}

/// No two kinds' views share a name.
pub(super) fn check_view_names(c: &mut Checker, views: &[(String, &TypedView)]) {
    let mut seen: std::collections::BTreeMap<&str, &str> = Default::default();
    for (base, view) in views {
        if let Some(other) = seen.insert(view.name.as_str(), base.as_str()) {
            c.fail(
                format!("{base}.view"),
                format!(
                    "{:?} is already the view of {other}; name one of them with view = \"...\"",
                    view.name
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_default_names() {
        assert!(is_identifier("amount_due"));
        assert!(is_identifier("_x1"));
        for bad in [
            "",
            "1a",
            "Amount",
            "a-b",
            "a b",
            "a;drop",
            "a\"b",
            &"x".repeat(64),
        ] {
            assert!(!is_identifier(bad), "{bad:?}");
        }
        assert_eq!(
            default_view_name("stripe-live", "invoice"),
            "stripe_live_invoice"
        );
        assert_eq!(default_view_name("1shop", "Order"), "_1shop_order");
    }
}
