//! Running the real binary: the command, signals, configuration files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary with none of the caller's environment that would change what it does
/// (a config path, a systemd socket).
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_webhook-reconciler"));
    c.env_remove("WEBHOOK_RECONCILER_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC");
    c
}

/// Sends `sig` (`TERM`, `KILL`, `STOP`, ...) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill -{sig} {pid}");
}

/// Writes `text` as `config.toml` in `dir`.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("config.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Writes the configuration and migrates its database, so a test can watch tables from
/// the first moment of the process under test.
pub fn write_migrated_config(dir: &Path, text: &str) -> PathBuf {
    let p = write_config(dir, text);
    let out = bin()
        .arg("--config")
        .arg(&p)
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    p
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped: a test that fails while it runs leaves no
/// daemon behind.
pub struct Running(pub std::process::Child);

impl Running {
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
