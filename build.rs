//! Build script: the migrations folder, and the git commit the binary is built from
//! (for `--version`): from `WR_GIT_COMMIT` when set (a build from a tarball or a
//! packaging system), else from `git` when the source is a checkout, else "unknown".
use std::process::Command;

fn main() {
    // embed_migrations! does not track the folder; without this a new migration would
    // not be picked up by an incremental build.
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-env-changed=WR_GIT_COMMIT");
    // Only paths that exist: cargo takes a missing one as changed and rebuilds every
    // time (a checkout without `.git/packed-refs`). `git pack-refs` creating it also
    // changes `.git/refs/heads`, so the commit is still read again then.
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("WR_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=WR_GIT_COMMIT={commit}");
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !commit.is_empty()).then_some(commit)
}
