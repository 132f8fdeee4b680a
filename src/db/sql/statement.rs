//! Statements as text with `$n` placeholders and values bound to them, and which of
//! them each connection keeps prepared.

use std::marker::PhantomData;

use diesel::backend::Backend as DieselBackend;
use diesel::query_builder::{AstPass, BoxedSqlQuery, Query, QueryFragment, QueryId, SqlQuery};
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};

use crate::config::Backend;

/// A statement written with `$n` placeholders, ready for `backend`.
pub(crate) fn query(backend: Backend, sql: &str) -> Sql {
    let text = match backend {
        Backend::Postgres => sql.to_owned(),
        Backend::Sqlite => sql.replace('$', "?"),
    };
    Sql {
        text,
        cached: false,
    }
}

/// Marks a statement built by [`query`] whose text never depends on its arguments
/// (arrays instead of lists of placeholders): each connection then prepares it once and
/// afterwards only binds and executes it. A text built from a number of rows must not
/// come here: the cache is per connection and unbounded.
///
/// Why our own [`Sql`] and [`Bind`] rather than diesel's `sql_query`: diesel never
/// caches a `sql_query` (it cannot know that the text is fixed), and a wrapper that
/// says otherwise is asked only when the query is passed by value (`load`,
/// `get_result`); `execute` passes it by reference, and diesel's `&T` asks the text
/// itself, so every `execute` was parsed and planned anew (the run's finish: 20,002
/// plans in 20,002 calls at 10,000 accounts).
pub(crate) fn prepared<Q: Cacheable>(query: Q) -> Q {
    query.cached()
}

/// A statement's text, the start of a chain of [`Bind`]s.
#[must_use = "a statement runs only when loaded or executed"]
pub(crate) struct Sql {
    text: String,
    cached: bool,
}

/// A statement with one more value bound to its next placeholder.
#[must_use = "a statement runs only when loaded or executed"]
pub(crate) struct Bind<Q, V, ST> {
    query: Q,
    value: V,
    _type: PhantomData<ST>,
}

impl Sql {
    /// For a text whose number of binds is known only at run time: diesel's boxed
    /// `sql_query`, never cached (such a text is not [`prepared`] either).
    pub(crate) fn into_boxed<'f, DB: DieselBackend>(self) -> BoxedSqlQuery<'f, DB, SqlQuery> {
        debug_assert!(!self.cached, "a prepared text has a fixed number of binds");
        diesel::sql_query(self.text).into_boxed()
    }

    pub(crate) fn bind<ST, V>(self, value: V) -> Bind<Self, V, ST> {
        Bind {
            query: self,
            value,
            _type: PhantomData,
        }
    }
}

impl<Q, V, ST> Bind<Q, V, ST> {
    pub(crate) fn bind<ST2, V2>(self, value: V2) -> Bind<Self, V2, ST2> {
        Bind {
            query: self,
            value,
            _type: PhantomData,
        }
    }
}

/// What [`prepared`] marks: the text at the start of a chain of binds.
pub(crate) trait Cacheable {
    fn cached(self) -> Self;
}

impl Cacheable for Sql {
    fn cached(self) -> Self {
        Sql {
            cached: true,
            ..self
        }
    }
}

impl<Q: Cacheable, V, ST> Cacheable for Bind<Q, V, ST> {
    fn cached(self) -> Self {
        Bind {
            query: self.query.cached(),
            ..self
        }
    }
}

impl<DB: DieselBackend> QueryFragment<DB> for Sql {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        if !self.cached {
            out.unsafe_to_cache_prepared();
        }
        out.push_sql(&self.text);
        Ok(())
    }
}

impl<Q, V, ST, DB> QueryFragment<DB> for Bind<Q, V, ST>
where
    DB: DieselBackend + HasSqlType<ST>,
    Q: QueryFragment<DB>,
    V: ToSql<ST, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> diesel::QueryResult<()> {
        self.query.walk_ast(out.reborrow())?;
        // The text carries its own placeholders; only the value is added.
        out.push_bind_param_value_only(&self.value)
    }
}

impl QueryId for Sql {
    type QueryId = ();
    // Keyed by its SQL text, not by its Rust type: one type serves many texts.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q, V, ST> QueryId for Bind<Q, V, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Sql {
    type SqlType = Untyped;
}

impl<Q, V, ST> Query for Bind<Q, V, ST> {
    type SqlType = Untyped;
}

impl<C> diesel::RunQueryDsl<C> for Sql {}
impl<Q, V, ST, C> diesel::RunQueryDsl<C> for Bind<Q, V, ST> {}

#[cfg(test)]
mod tests;
