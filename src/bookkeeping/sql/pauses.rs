//! `reconcile_paused`: the kinds an operator paused.

use super::*;

/// Pauses (or resumes) reconciling `kind` of `source` (stored `""`: every kind of it);
/// whether anything changed.
pub(crate) fn set_reconcile_paused(
    conn: &mut Conn,
    source: &str,
    kind: &str,
    paused: bool,
) -> diesel::QueryResult<bool> {
    let q = if paused {
        query(
            conn.backend(),
            "INSERT INTO reconcile_paused (source, kind) VALUES ($1, $2) ON CONFLICT (source, kind) DO NOTHING",
        )
    } else {
        query(
            conn.backend(),
            "DELETE FROM reconcile_paused WHERE source = $1 AND kind = $2",
        )
    };
    Ok(on_conn!(conn, c => q.bind::<Text, _>(source).bind::<Text, _>(kind).execute(c))? > 0)
}

/// Whether `kind` of `source` is paused, by itself or with its whole source.
pub(crate) fn reconcile_paused(
    conn: &mut Conn,
    source: &str,
    kind: &str,
) -> diesel::QueryResult<bool> {
    let q = query(
        conn.backend(),
        "SELECT COUNT(*) AS n FROM reconcile_paused WHERE source = $1 AND (kind = $2 OR kind = '')",
    );
    Ok(
        on_conn!(conn, c => prepared(q.bind::<Text, _>(source).bind::<Text, _>(kind)).get_result::<N>(c))?.n
            > 0,
    )
}

/// Every pause, as (source, kind) (`kind` `""`: the whole source; [`PausedRow::key`]
/// says which).
#[derive(Debug, Clone, diesel::QueryableByName, serde::Serialize)]
pub struct PausedRow {
    #[diesel(sql_type = Text)]
    pub source: String,
    #[diesel(sql_type = Text)]
    pub kind: String,
    #[diesel(sql_type = Text)]
    pub paused_at: String,
}

impl PausedRow {
    pub fn key(&self) -> crate::change::PauseKey {
        crate::change::PauseKey {
            source: self.source.clone(),
            kinds: crate::change::KindScope::from_stored(self.kind.as_str()),
        }
    }
}

pub(crate) fn paused_rows(conn: &mut Conn) -> diesel::QueryResult<Vec<PausedRow>> {
    let b = conn.backend();
    let q = query(
        b,
        &format!(
            "SELECT source, kind, {} AS paused_at FROM reconcile_paused ORDER BY source, kind",
            display_time(b, "paused_at")
        ),
    );
    on_conn!(conn, c => q.load(c))
}
