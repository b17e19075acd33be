//! Starting and stopping a target's command (`cold-start`, `first-call --cmd`): [`Started`].
//!
//! The command is a list of words, run directly (no shell): the first is the program. Its
//! output is discarded. It stays in this process's group, so Ctrl-C in the terminal reaches
//! it too; stopping it signals that one process: SIGTERM, then SIGKILL after [`STOP_GRACE`].
//! A command that starts the real server as a child (a script, `cargo run`) should `exec` it,
//! or the child outlives the stop. Dropping a [`Started`] that was not stopped kills it.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

use crate::BenchError;

/// How long a command gets to exit after SIGTERM before it is killed.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// How often a stopping command is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// A running command.
#[derive(Debug)]
pub(crate) struct Started {
    child: Option<Child>,
    /// Just before the exec.
    pub(crate) exec_at: Instant,
    target: String,
    command: String,
}

/// How a command ended when it was stopped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopped {
    /// From SIGTERM to exit.
    pub(crate) took: Duration,
    /// Whether SIGKILL was needed.
    pub(crate) killed: bool,
}

/// Starts `words` (program first) for `target`.
pub(crate) fn start(target: &str, words: &[String]) -> Result<Started, BenchError> {
    let command = crate::join_command(words);
    let error = |source| BenchError::Command {
        target: target.to_owned(),
        command: command.clone(),
        source,
    };
    let (program, args) = words.split_first().ok_or_else(|| {
        error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ))
    })?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let exec_at = Instant::now();
    let child = cmd.spawn().map_err(error)?;
    Ok(Started {
        child: Some(child),
        exec_at,
        target: target.to_owned(),
        command,
    })
}

impl Started {
    /// The exit status, if the command has already ended on its own.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`]; waits for the exit.
    pub(crate) async fn stop(mut self) -> Result<Stopped, BenchError> {
        let Some(mut child) = self.child.take() else {
            return Ok(Stopped {
                took: Duration::ZERO,
                killed: false,
            });
        };
        let error = |source| BenchError::Command {
            target: self.target.clone(),
            command: self.command.clone(),
            source,
        };
        let asked = Instant::now();
        if child.try_wait().map_err(error)?.is_none() {
            let _ = kill_process(Pid::from_child(&child), Signal::TERM);
        }
        while asked.elapsed() < STOP_GRACE {
            if child.try_wait().map_err(error)?.is_some() {
                return Ok(Stopped {
                    took: asked.elapsed(),
                    killed: false,
                });
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        let _ = child.kill();
        loop {
            if child.try_wait().map_err(error)?.is_some() {
                return Ok(Stopped {
                    took: asked.elapsed(),
                    killed: true,
                });
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stops_with_sigterm() {
        let words = ["sleep", "30"].map(String::from);
        let mut started = start("t", &words).unwrap();
        assert!(started.exited().is_none());
        let stopped = started.stop().await.unwrap();
        assert!(!stopped.killed);
        assert!(stopped.took < STOP_GRACE);
    }

    #[tokio::test]
    async fn missing_program_is_an_error() {
        let words = ["/nonexistent/wharf-bench-test".to_owned()];
        assert!(matches!(
            start("t", &words),
            Err(BenchError::Command { .. })
        ));
    }
}
