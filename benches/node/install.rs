//! The Node baselines' folder, with its one package (`pg`, pinned by the lockfile)
//! installed by `npm ci` when missing; `None` without node and npm. Shared by the
//! benchmarks that run a Node program beside ours.

pub fn node_dir() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/node");
    if !dir.join("node_modules/pg").exists() {
        let st = std::process::Command::new("npm")
            .args(["ci", "--silent", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .ok()?;
        if !st.success() {
            return None;
        }
    }
    Some(dir)
}
