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
            // The user's probe query on the user's database, never ours.
            "prove/probe.rs",
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
            "typed_views",
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
        // The one unit test against PostgreSQL finds its server as tests/it does.
        let bad = offenders(
            needle,
            &["config", "cli/generate.rs", "db/sql/statement/tests.rs"],
        );
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

/// The modules `src/` is made of, by path (`["store", "sql", "fetches"]`), with their
/// code: comments and `#[cfg(test)] mod tests` left out.
fn modules() -> std::collections::BTreeMap<Vec<String>, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = std::collections::BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap().with_extension("");
        let mut path: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            path.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            path.pop();
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        out.insert(path, code);
    }
    out
}

/// The module a path names: its longest prefix that is a module.
fn module_of<'a>(
    mods: &'a std::collections::BTreeMap<Vec<String>, String>,
    path: &[String],
) -> Option<&'a Vec<String>> {
    (1..=path.len())
        .rev()
        .find_map(|n| mods.get_key_value(&path[..n]).map(|(k, _)| k))
}

/// Which modules each module imports (`crate::…` and `super::…` paths; a module's own
/// ancestors are not counted: a child uses its parent's items by design).
fn import_graph() -> std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>
{
    let mods = modules();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut graph = std::collections::BTreeMap::new();
    for (m, code) in &mods {
        let mut targets = std::collections::BTreeSet::new();
        let mut add = |path: Vec<String>| {
            if let Some(t) = module_of(&mods, &path)
                && t != m
                && !m.starts_with(t)
            {
                targets.insert(t.clone());
            }
        };
        for (prefix, base) in [
            ("crate::", Vec::new()),
            ("super::", m[..m.len().saturating_sub(1)].to_vec()),
        ] {
            for (i, _) in code.match_indices(prefix) {
                if prefix == "crate::" && code[..i].ends_with("super::") {
                    continue;
                }
                let rest = &code[i + prefix.len()..];
                let mut path = base.clone();
                let mut at = rest;
                loop {
                    let seg = ident(at);
                    if seg.is_empty() {
                        break;
                    }
                    at = &at[seg.len()..];
                    path.push(seg);
                    if let Some(next) = at.strip_prefix("::") {
                        at = next;
                    } else {
                        break;
                    }
                }
                // `a::{b, c::d}`: each branch's first segment too.
                if let Some(group) = at.strip_prefix('{') {
                    for item in group.split('}').next().unwrap_or("").split(',') {
                        let seg = ident(item.trim());
                        if !seg.is_empty() && seg != "self" {
                            let mut p = path.clone();
                            p.push(seg);
                            add(p);
                        }
                    }
                }
                add(path);
            }
        }
        graph.insert(m.clone(), targets);
    }
    graph
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let graph = import_graph();
    // Depth-first search for a back edge; the first circle found is reported.
    fn visit(
        m: &Vec<String>,
        graph: &std::collections::BTreeMap<Vec<String>, std::collections::BTreeSet<Vec<String>>>,
        state: &mut std::collections::BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for t in graph.get(m).into_iter().flatten() {
            match state.get(t) {
                Some(1) => {
                    let from = stack.iter().position(|s| s == t).unwrap();
                    let mut circle: Vec<String> =
                        stack[from..].iter().map(|p| p.join("::")).collect();
                    circle.push(t.join("::"));
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(t, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    for m in graph.keys() {
        if !state.contains_key(m)
            && let Some(circle) = visit(m, &graph, &mut state, &mut Vec::new())
        {
            panic!(
                "files import each other in a circle: {}; move what both need below both",
                circle.join(" -> ")
            );
        }
    }
}

/// ARCHITECTURE.md's layers, lowest first: a module imports only from its own layer or
/// below (within a layer, the file graph above has no circle).
const LAYERS: &[&[&str]] = &[
    &[
        "config",
        "credential",
        "signature",
        "change",
        "telemetry",
        "shutdown",
        "db",
    ],
    &["observability", "bookkeeping", "feed", "store", "accounts"],
    &["sender", "ingest", "webhook", "simulator"],
    &[
        "reconcile",
        "operations",
        "health",
        "retention",
        "systemd",
        "prove",
    ],
    &["http", "app"],
    &["cli", "demo", "lib", "main"],
];

#[test]
fn modules_import_only_from_their_layer_or_below() {
    let layer = |m: &Vec<String>| -> usize {
        let top = m.first().map(String::as_str).unwrap_or("lib");
        LAYERS
            .iter()
            .position(|l| l.contains(&top))
            .unwrap_or_else(|| {
                panic!("module {top} is in no layer of LAYERS (and ARCHITECTURE.md)")
            })
    };
    let mut upward = Vec::new();
    for (m, targets) in import_graph() {
        for t in targets {
            if layer(&t) > layer(&m) {
                upward.push(format!("{} -> {}", m.join("::"), t.join("::")));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a higher layer (move the shared part down, or let the caller pass it):\n{}",
        upward.join("\n")
    );
}

/// The tables a typed view may not be named after are the tables the migrations make.
#[test]
fn the_names_a_view_may_not_take_are_the_migrations_tables() {
    let mut made = std::collections::BTreeSet::new();
    for backend in ["postgres", "sqlite"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(backend);
        for m in std::fs::read_dir(dir).unwrap() {
            let up = std::fs::read_to_string(m.unwrap().path().join("up.sql")).unwrap();
            for line in up.lines() {
                if let Some(rest) = line.trim().strip_prefix("CREATE TABLE ") {
                    let name = rest
                        .split_whitespace()
                        .next()
                        .unwrap()
                        .trim_end_matches('(');
                    // SQLite's rebuilt tables are renamed to the table they replace.
                    if !name.ends_with("_new") && !name.ends_with("_old") {
                        made.insert(name.to_string());
                    }
                }
            }
        }
    }
    let listed: std::collections::BTreeSet<String> =
        webhook_reconciler::config::validate_columns::OUR_TABLES
            .iter()
            .map(|t| t.to_string())
            .collect();
    assert_eq!(made, listed, "config::validate::columns::OUR_TABLES");
}
