//! Running one runtime step: no shell, the step environment only, output
//! passed through line by line with secrets redacted, and a SIGTERM or
//! SIGINT received by the runner forwarded to the runtime alone (its plugins
//! get theirs from it), then SIGKILL after the stop timeout.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::plan::{self, Plan};
use super::redact::Redactor;
use super::steps::Stdout;

/// How much of a step's standard output is kept when asked.
pub const STDOUT_KEEP: usize = 1 << 20;

/// How much of the end of a step's standard error is kept for its summary
/// (and of an apply's standard output, for its summary line).
pub const STDERR_TAIL: usize = 64 << 10;

/// How long the output of a finished runtime is still read: a grandchild
/// holding the pipe open must not hang the run.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// A stop request the runner received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupt {
    Term,
    Int,
}

impl Interrupt {
    pub const fn name(self) -> &'static str {
        match self {
            Interrupt::Term => "SIGTERM",
            Interrupt::Int => "SIGINT",
        }
    }

    fn signal(self) -> rustix::process::Signal {
        match self {
            Interrupt::Term => rustix::process::Signal::TERM,
            Interrupt::Int => rustix::process::Signal::INT,
        }
    }
}

/// The runner's SIGTERM and SIGINT, caught from the start so that neither
/// kills the runner before it has written its result.
pub struct Signals {
    term: Signal,
    int: Signal,
    first: Option<Interrupt>,
}

impl Signals {
    pub fn install() -> io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            first: None,
        })
    }

    async fn next(&mut self) -> Interrupt {
        let got = tokio::select! {
            _ = self.term.recv() => Interrupt::Term,
            _ = self.int.recv() => Interrupt::Int,
        };
        self.first.get_or_insert(got);
        got
    }

    /// The first stop request received so far, without waiting.
    pub async fn received(&mut self) -> Option<Interrupt> {
        tokio::select! {
            biased;
            got = self.next() => Some(got),
            _ = std::future::ready(()) => self.first,
        }
    }
}

/// One runtime invocation.
pub struct Invocation<'a> {
    pub bin: &'a Path,
    pub args: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a BTreeMap<OsString, OsString>,
    pub stdout: Stdout,
    pub stop_timeout: Duration,
}

/// How a step ended.
#[derive(Clone, Debug)]
pub struct Finished {
    /// The exit code, or 128 + the signal that ended the runtime.
    pub exit_code: i32,
    pub duration: Duration,
    /// The head of standard output, when kept.
    pub stdout: Vec<u8>,
    /// The tail of standard error.
    pub stderr: Vec<u8>,
    /// Standard output read as a plan, when asked ([`Stdout::Plan`]).
    pub plan: Option<Result<Plan, String>>,
    /// Set when a stop request arrived during the step.
    pub interrupted: Option<Stopped>,
}

/// A stop request forwarded during a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub signal: Interrupt,
    /// The runtime outlived the stop timeout and was killed.
    pub killed: bool,
}

/// Runs one step to its end.
pub async fn run(
    inv: &Invocation<'_>,
    signals: &mut Signals,
    redactor: &Arc<Redactor>,
) -> io::Result<Finished> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(inv.bin)
        .args(inv.args)
        .current_dir(inv.cwd)
        .env_clear()
        .envs(inv.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut shown = None;
    let stdout = match (child.stdout.take(), inv.stdout) {
        (Some(out), Stdout::Plan) => {
            shown = Some(tokio::task::spawn_blocking(move || read_plan(out)));
            None
        }
        (Some(out), mode) => {
            let redactor = Arc::clone(redactor);
            let keep = match mode {
                Stdout::LogAndKeep => Keep::Head(STDOUT_KEEP),
                Stdout::LogAndKeepTail => Keep::Tail(STDERR_TAIL),
                _ => Keep::None,
            };
            Some(tokio::spawn(async move {
                pump(out, Sink::Stdout, &redactor, keep).await
            }))
        }
        (None, _) => None,
    };
    let stderr = child.stderr.take().map(|err| {
        let redactor = Arc::clone(redactor);
        tokio::spawn(
            async move { pump(err, Sink::Stderr, &redactor, Keep::Tail(STDERR_TAIL)).await },
        )
    });

    let mut interrupted: Option<Stopped> = None;
    let kill_at = tokio::time::sleep(Duration::MAX);
    tokio::pin!(kill_at);
    let status: ExitStatus = loop {
        tokio::select! {
            status = child.wait() => break status?,
            got = signals.next() => {
                if let Some(pid) = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)) {
                    // The runtime may have exited just now; then there is
                    // nothing left to stop.
                    let _ = rustix::process::kill_process(pid, got.signal());
                }
                if interrupted.is_none() {
                    interrupted = Some(Stopped { signal: got, killed: false });
                    kill_at.as_mut().reset(tokio::time::Instant::now() + inv.stop_timeout);
                }
            }
            () = &mut kill_at, if interrupted.is_some_and(|s| !s.killed) => {
                child.start_kill()?;
                interrupted = interrupted.map(|s| Stopped { killed: true, ..s });
            }
        }
    };

    let collect = |task: Option<tokio::task::JoinHandle<io::Result<Vec<u8>>>>| async move {
        match task {
            Some(task) => match tokio::time::timeout(DRAIN_GRACE, task).await {
                Ok(Ok(Ok(kept))) => kept,
                _ => Vec::new(),
            },
            None => Vec::new(),
        }
    };
    let (stdout, stderr) = tokio::join!(collect(stdout), collect(stderr));
    let plan = match shown {
        Some(task) => Some(match tokio::time::timeout(DRAIN_GRACE, task).await {
            Ok(Ok(read)) => read,
            _ => Err("the plan was not read to its end".to_string()),
        }),
        None => None,
    };
    Ok(Finished {
        exit_code: exit_code(status),
        duration: started.elapsed(),
        stdout,
        stderr,
        plan,
        interrupted,
    })
}

/// The exit code a shell would report.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

#[derive(Clone, Copy)]
enum Keep {
    None,
    Head(usize),
    Tail(usize),
}

/// Passes `from` through to the runner's own stream, a redacted line at a
/// time, keeping what `keep` asks for (unredacted: the runner reads it, and
/// redacts what it reports).
async fn pump(
    from: impl AsyncRead + Unpin,
    to: Sink,
    redactor: &Redactor,
    keep: Keep,
) -> io::Result<Vec<u8>> {
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    let mut kept = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Ok(kept);
        }
        let mut shown = redactor.bytes(&line);
        if !shown.ends_with(b"\n") {
            shown.push(b'\n');
        }
        // One write per line keeps lines whole when the runner logs too. A
        // closed log stream must not fail the step, so its errors are ignored.
        let _ = match to {
            Sink::Stdout => io::stdout().lock().write_all(&shown),
            Sink::Stderr => io::stderr().lock().write_all(&shown),
        };
        match keep {
            Keep::None => {}
            Keep::Head(max) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&line[..line.len().min(room)]);
            }
            Keep::Tail(max) => {
                kept.extend_from_slice(&line);
                if kept.len() > max {
                    kept.drain(..kept.len() - max);
                }
            }
        }
    }
}

/// Reads a plan from the runtime's output as it streams, and drains what is
/// left after an error so that the runtime never blocks on a full pipe.
fn read_plan(out: impl AsyncRead + Unpin) -> Result<Plan, String> {
    let mut from = tokio_util::io::SyncIoBridge::new(out);
    let read = plan::read(&mut from).map_err(|e| e.to_string());
    let _ = io::copy(&mut from, &mut io::sink());
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        for (raw, want) in [(0, 0), (1 << 8, 1), (2 << 8, 2), (9, 137), (15, 143)] {
            assert_eq!(exit_code(ExitStatus::from_raw(raw)), want, "{raw}");
        }
    }

    #[tokio::test]
    async fn pump_keeps_head_or_tail() {
        let input: &[u8] = b"one\ntwo secret-word\nthree";
        let r = Redactor::new([b"secret-word".to_vec()]).unwrap();
        assert_eq!(
            pump(input, Sink::Stderr, &r, Keep::None).await.unwrap(),
            b""
        );
        assert_eq!(
            pump(input, Sink::Stderr, &r, Keep::Head(6)).await.unwrap(),
            b"one\ntw"
        );
        assert_eq!(
            pump(input, Sink::Stderr, &r, Keep::Tail(7)).await.unwrap(),
            b"d\nthree"
        );
        assert_eq!(
            pump(input, Sink::Stderr, &r, Keep::Head(1 << 20))
                .await
                .unwrap(),
            input
        );
    }
}
