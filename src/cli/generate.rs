//! Files generated from the command line's own definition, so they never drift from it:
//! shell completions and the man page (the Debian package ships both).

use std::io::Write;
use std::path::Path;

use anyhow::Context;

use clap::CommandFactory;

use super::Cli;

/// Writes the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
    Ok(())
}

/// Writes the man pages: into `dir`, one file per command (`webhook-reconciler.1`,
/// `webhook-reconciler-serve.1`, …, as git does); without it, the top-level page to
/// stdout.
pub fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Cli::command()).render(&mut out)?;
            std::io::stdout().write_all(&out)?;
            Ok(())
        }
    }
}
