//! ARCHITECTURE.md's structural invariants, checked on the source text: each table has
//! one owner and only it names its SQL module; only `config` reads the environment;
//! only `http` (and the simulator, the sender's side) knows axum. A file that breaks
//! one fails here with its path and line.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Lines of code (comments left out) under `src/` that contain `needle`, outside the
/// given module directories or files (relative to `src/`).
fn offenders(needle: &str, allowed: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if allowed
            .iter()
            .any(|a| rel == *a || rel.starts_with(&format!("{a}/")))
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains(needle) {
                found.push(format!("src/{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn each_tables_sql_is_named_only_by_its_owner() {
    for (module, owner) in [
        ("store::sql", "store"),
        ("bookkeeping::sql", "bookkeeping"),
        ("feed::sql", "feed"),
        ("accounts::sql", "accounts"),
    ] {
        let bad = offenders(module, &[owner]);
        assert!(
            bad.is_empty(),
            "{module} is {owner}'s; call {owner}'s methods instead:\n{}",
            bad.join("\n")
        );
    }
    // The shared statement helpers are for the owners' SQL modules only.
    let bad = offenders(
        "db::sql",
        &["db", "store", "bookkeeping", "feed", "accounts"],
    );
    assert!(
        bad.is_empty(),
        "db::sql is for the table owners' SQL:\n{}",
        bad.join("\n")
    );
    // Nothing else declares SQL of its own.
    let bad = offenders(
        "sql_query(",
        &[
            "db",
            "store/sql",
            "bookkeeping/sql",
            "feed/sql.rs",
            "accounts/sql.rs",
        ],
    );
    assert!(bad.is_empty(), "SQL outside db:\n{}", bad.join("\n"));
}

/// The tables each owner keeps (ARCHITECTURE's code map), and the files its SQL is in.
const OWNERS: &[(&str, &[&str], &[&str])] = &[
    (
        "store",
        &["store/sql"],
        &[
            "resources",
            "processed_events",
            "dead_letters",
            "pending_fetches",
        ],
    ),
    (
        "bookkeeping",
        &["bookkeeping/sql"],
        &[
            "reconcile_runs",
            "reconcile_leases",
            "reconcile_checkpoints",
            "reconcile_state",
            "reconcile_last_success",
            "reconcile_paused",
            "reconcile_due",
            "prune_runs",
        ],
    ),
    (
        "feed",
        &["feed/sql.rs"],
        &[
            "change_pending",
            "changes",
            "change_seq",
            "consumer_positions",
            "consumer_skips",
        ],
    ),
    ("accounts", &["accounts/sql.rs"], &["accounts"]),
];

/// Each owner's SQL names only its own tables: a statement that reads or writes another
/// owner's table (`FROM`, `JOIN`, `INTO`, `UPDATE`, `DELETE FROM`, `TABLE`) fails here
/// with its file and line. Another owner's data is asked of that owner, or a step of its
/// own runs in the caller's transaction.
#[test]
fn each_owners_sql_names_only_its_own_tables() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (owner, dirs, _) in OWNERS {
        let theirs: Vec<&str> = OWNERS
            .iter()
            .filter(|(o, _, _)| o != owner)
            .flat_map(|(_, _, tables)| tables.iter().copied())
            .collect();
        let mut files = Vec::new();
        for d in *dirs {
            let path = src.join(d);
            if path.is_dir() {
                rust_files(&path, &mut files);
            } else {
                files.push(path);
            }
        }
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("").to_ascii_uppercase();
                for table in &theirs {
                    let t = table.to_ascii_uppercase();
                    let named = ["FROM ", "JOIN ", "INTO ", "UPDATE ", "TABLE "]
                        .iter()
                        .any(|kw| {
                            code.match_indices(&format!("{kw}{t}")).any(|(i, m)| {
                                let after = code[i + m.len()..].chars().next();
                                !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                            })
                        });
                    if named {
                        bad.push(format!(
                            "{}:{}: {owner} names {table}: {}",
                            file.strip_prefix(&src).unwrap().display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "SQL on another owner's table:\n{}",
        bad.join("\n")
    );
}

#[test]
fn only_config_reads_the_environment() {
    for needle in ["std::env::var", "env::var_os", "std::env::vars"] {
        let bad = offenders(needle, &["config", "cli/generate.rs"]);
        assert!(
            bad.is_empty(),
            "only config reads the environment:\n{}",
            bad.join("\n")
        );
    }
}

#[test]
fn only_http_and_the_simulator_know_axum() {
    let bad = offenders("axum::", &["http", "simulator", "demo", "app.rs"]);
    assert!(bad.is_empty(), "axum outside http:\n{}", bad.join("\n"));
}
