use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Integer};
use diesel::{Connection, PgConnection, RunQueryDsl};

use super::*;

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn kept(c: &mut PgConnection, text: &str) -> i64 {
    query(
        Backend::Postgres,
        "SELECT COUNT(*) AS n FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind::<diesel::sql_types::Text, _>(text)
    .get_result::<N>(c)
    .unwrap()
    .n
}

/// The session's own prepared statements are in `pg_prepared_statements`: a text
/// marked [`prepared`] is there once, however it was run (`execute` passes the query
/// by reference, where diesel's `sql_query` was never cached), and a text not marked
/// is not there at all.
#[test]
fn a_prepared_text_is_prepared_once_on_execute_and_load() {
    let server =
        std::env::var("WR_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let mut c = PgConnection::establish(&format!("{server}/test")).unwrap();
    c.batch_execute("CREATE TEMP TABLE t (a INTEGER, b BIGINT)")
        .unwrap();
    let update = "UPDATE t SET b = $2 WHERE a = $1";
    let insert = "INSERT INTO t (a, b) VALUES ($1, $2) RETURNING b AS n";
    let unmarked = "UPDATE t SET b = b + $1";
    for i in 0..8 {
        let row: N = prepared(
            query(Backend::Postgres, insert)
                .bind::<Integer, _>(i)
                .bind::<BigInt, _>(1),
        )
        .get_result(&mut c)
        .unwrap();
        assert_eq!(row.n, 1);
        let n = prepared(
            query(Backend::Postgres, update)
                .bind::<Integer, _>(i)
                .bind::<BigInt, _>(7),
        )
        .execute(&mut c)
        .unwrap();
        assert_eq!(n, 1);
        query(Backend::Postgres, unmarked)
            .bind::<BigInt, _>(1)
            .execute(&mut c)
            .unwrap();
    }
    assert_eq!(kept(&mut c, insert), 1);
    assert_eq!(kept(&mut c, update), 1);
    assert_eq!(kept(&mut c, unmarked), 0);
    let sum: N = query(Backend::Postgres, "SELECT SUM(b)::bigint AS n FROM t")
        .get_result(&mut c)
        .unwrap();
    // Row i: 7 from its update, then 1 from each unmarked update of rounds i..8.
    assert_eq!(sum.n, (0..8).map(|i| 7 + (8 - i)).sum::<i64>());
}
