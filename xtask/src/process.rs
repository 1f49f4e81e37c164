//! Runs one command of the suite, hands its output to
//! the caller line by line (and into a log in target/test-logs/), and stops it
//! when it runs past a time limit.
//!
//! Time limits apply only in CI (`CI` set), as in scripts/test.sh before:
//! there a command that runs too long is hung, and stopping it lets the
//! summary line still be printed. The command then runs in a process group of
//! its own, so that stopping it also stops everything it started (cargo's
//! test processes, the notebook kernel). On a terminal there is no limit and
//! no separate group, so Ctrl-C reaches the command and all its children.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// After SIGTERM, how long a stopped command may take to exit before SIGKILL
/// (what `timeout --kill-after=30s` did).
const KILL_AFTER: Duration = Duration::from_secs(30);
/// After SIGKILL, how long to keep reading output that something outside the
/// process group may still hold open.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Whether stderr comes through the same pipe as stdout (like `2>&1`: the
/// lines keep their order) or through its own (for machine-readable stdout
/// that stderr lines must not break into).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streams {
    Merged,
    Separate,
}

#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    /// Stopped at its time limit.
    pub timed_out: bool,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.status.success() && !self.timed_out
    }
}

/// Runs `command` to its end (or its `limit`), calling `on_line` with every
/// line it prints, in the caller's thread. Its stdin is empty.
pub fn run_with_lines(
    mut command: Command,
    streams: Streams,
    limit: Option<Duration>,
    mut on_line: impl FnMut(Stream, &str),
) -> io::Result<Finished> {
    command.stdin(Stdio::null());
    if limit.is_some() {
        command.process_group(0); // its own group: stopping it stops its children
    }
    let (sender, lines) = mpsc::channel::<(Stream, String)>();
    let mut child = match streams {
        Streams::Merged => {
            let (reader, writer) = io::pipe()?;
            command.stdout(writer.try_clone()?).stderr(writer);
            let child = command.spawn()?;
            drop(command); // closes our copies of the write end: EOF comes when the child's close too
            forward_lines(reader, Stream::Stdout, sender);
            child
        }
        Streams::Separate => {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut child = command.spawn()?;
            forward_lines(child.stdout.take().expect("piped"), Stream::Stdout, sender.clone());
            forward_lines(child.stderr.take().expect("piped"), Stream::Stderr, sender);
            child
        }
    };

    // Stage of stopping a command past its limit: each has its own deadline.
    let mut deadline = limit.map(|limit| Instant::now() + limit);
    let mut timed_out = false;
    let mut killed = false;
    loop {
        let received = match deadline {
            Some(at) => lines.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => lines.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok((stream, line)) => on_line(stream, &line),
            Err(RecvTimeoutError::Disconnected) => break, // both streams closed
            Err(RecvTimeoutError::Timeout) if !timed_out => {
                timed_out = true;
                signal_group(child.id(), SIGTERM);
                deadline = Some(Instant::now() + KILL_AFTER);
            }
            Err(RecvTimeoutError::Timeout) if !killed => {
                killed = true;
                signal_group(child.id(), SIGKILL);
                deadline = Some(Instant::now() + DRAIN_AFTER_KILL);
            }
            Err(RecvTimeoutError::Timeout) => break, // a stray grandchild holds the pipe: stop reading
        }
    }
    let status = child.wait()?;
    Ok(Finished { status, timed_out })
}

/// Reads `source` line by line in a thread of its own and sends each line,
/// without its line ending, to `sender`.
fn forward_lines(source: impl Read + Send + 'static, stream: Stream, sender: mpsc::Sender<(Stream, String)>) {
    thread::spawn(move || {
        let mut reader = BufReader::new(source);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer);
                    let line = line.trim_end_matches(['\n', '\r']).to_string();
                    if sender.send((stream, line)).is_err() {
                        return; // the caller stopped listening
                    }
                }
            }
        }
    });
}

const SIGTERM: i32 = 15;
const SIGKILL: i32 = 9;

extern "C" {
    /// POSIX kill(2), from the C library every Rust program on unix links.
    fn kill(pid: i32, signal: i32) -> i32;
}

/// Sends `signal` to the process group led by `leader` (the command was
/// started with `process_group(0)`, so its group id is its process id).
fn signal_group(leader: u32, signal: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a
    // group that has already exited only makes it return an error.
    unsafe {
        kill(-(leader as i32), signal);
    }
}

/// A command's output, kept in memory and in its log file.
pub struct Captured {
    pub finished: Finished,
    /// Everything it printed (stdout and stderr merged), one line per line.
    pub output: String,
}

/// Runs `command` with stdout and stderr merged into `log` (whose first line
/// is the command), echoing each line to our stdout when `echo` is set.
pub fn run_logged(command: Command, limit: Option<Duration>, log: &Path, echo: bool) -> io::Result<Captured> {
    let mut log_file = File::create(log)?;
    writeln!(log_file, "$ {}", command_line(&command))?;
    let mut output = String::new();
    let finished = run_with_lines(command, Streams::Merged, limit, |_, line| {
        if echo {
            println!("{line}");
        }
        let _ = writeln!(log_file, "{line}"); // a full disk must not stop the suite
        output.push_str(line);
        output.push('\n');
    })?;
    Ok(Captured { finished, output })
}

/// The command as a person would type it, for logs and messages.
pub fn command_line(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|arg| arg.to_string_lossy().into_owned()));
    words.join(" ")
}

/// "exit status 101", or "killed by signal 11 (SIGSEGV)" for a crash.
pub fn describe_status(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => {
            let name = match signal {
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                15 => " (SIGTERM)",
                _ => "",
            };
            format!("killed by signal {signal}{name}")
        }
        (None, None) => "an unknown exit status".to_string(),
    }
}

/// The last `count` lines of `text`.
pub fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Prints the last `count` lines of `text`, indented, when there are any.
pub fn print_last_lines(text: &str, count: usize) {
    for line in last_lines(text, count).lines() {
        println!("    {line}");
    }
}

/// A time limit in words: "30 min", "45 s".
pub fn describe_limit(limit: Duration) -> String {
    match limit.as_secs() {
        seconds if seconds % 60 == 0 => format!("{} min", seconds / 60),
        seconds => format!("{seconds} s"),
    }
}
