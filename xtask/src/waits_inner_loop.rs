//! The inner loop of `cargo xtask waits`
//! (xtask/src/waits.rs): a one-line scratch edit of an exercise until
//! `cargo test --test chapter_03` reports, measured `runs` times. The edit is
//! undone on drop (errors too), and by a watchdog process if the command is
//! killed (Ctrl-C); the next run removes any scratch line left anyway.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::process::{describe_status, run_with_lines, Streams};
use crate::waits_log::{cargo_build_seconds, test_run_seconds, without_scratch_edit, Row, SCRATCH_MARK};
use crate::Context;

const EXERCISE: &str = "src/ch03_averaging/exercise.rs";

/// The exercise with a scratch line appended for the time of a measurement:
/// restored on drop, and by a watchdog process if this one is killed.
struct ScratchEdit {
    path: PathBuf,
    original: String,
}

impl ScratchEdit {
    fn begin(path: &Path) -> Result<ScratchEdit, String> {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
        let mut original = read(path)?;
        if let Some(restored) = without_scratch_edit(&original) {
            std::fs::write(path, &restored).map_err(|e| format!("cannot restore {}: {e}", path.display()))?;
            println!("    removed a scratch line an interrupted run left in {}", path.display());
            original = restored;
        }
        if !original.ends_with('\n') {
            return Err(format!("{} does not end with a newline; run rustfmt on it first", path.display()));
        }
        // The watchdog: in a process group of its own, so Ctrl-C leaves it
        // running; once this process is gone it removes the scratch line.
        let script = r#"while kill -0 "$0" 2>/dev/null; do sleep 0.5; done
            if grep -qF "$2" "$1"; then sed -i "\#$2#d" "$1"; fi"#;
        use std::os::unix::process::CommandExt;
        Command::new("sh")
            .args(["-c", script, &std::process::id().to_string(), &path.to_string_lossy(), SCRATCH_MARK])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog that restores {}: {e}", path.display()))?;
        Ok(ScratchEdit { path: path.to_path_buf(), original })
    }

    fn apply(&self, run: usize) -> Result<(), String> {
        let edited = format!("{}{SCRATCH_MARK} ({run})\n", self.original);
        std::fs::write(&self.path, edited).map_err(|e| format!("cannot edit {}: {e}", self.path.display()))
    }
}

impl Drop for ScratchEdit {
    fn drop(&mut self) {
        if let Err(error) = std::fs::write(&self.path, &self.original) {
            eprintln!(
                "cargo xtask waits: cannot restore {}: {error}; remove its last line by hand",
                self.path.display()
            );
        }
    }
}

/// `cargo test --test chapter_03` once: its time, after checking it
/// reported, without the time it spent blocked on another build's lock
/// (this machine is shared); that time is returned apart.
fn chapter_test(ctx: &Context) -> Result<InnerRun, String> {
    let mut command = ctx.cargo();
    command.args(["test", "--test", "chapter_03"]);
    let log_path = ctx.log("waits-inner-loop.log");
    let mut log =
        std::fs::File::create(&log_path).map_err(|e| format!("cannot write {}: {e}", log_path.display()))?;
    let (started, mut blocked_until, mut blocked) = (Instant::now(), None, false);
    let (mut build, mut tests) = (0.0, 0.0);
    let mut reported = false;
    let finished = run_with_lines(command, Streams::Merged, None, |_, line| {
        let _ = writeln!(log, "{line}");
        if line.contains("Blocking waiting for file lock") {
            blocked = true;
        } else if blocked {
            // cargo prints nothing when it gets the lock: its next line comes then.
            blocked_until = Some(started.elapsed());
            blocked = false;
        }
        build += cargo_build_seconds(line).unwrap_or(0.0);
        if let Some(seconds) = test_run_seconds(line) {
            tests += seconds;
            reported = true;
        }
    })
    .map_err(|e| format!("cannot run cargo test --test chapter_03: {e}"))?;
    let total = started.elapsed().as_secs_f64();
    if !reported {
        return Err(format!(
            "cargo test --test chapter_03 ended ({}) without a test result (log: target/test-logs/waits-inner-loop.log)",
            describe_status(&finished.status)
        ));
    }
    let waited = blocked_until.map_or(0.0, |d| d.as_secs_f64());
    Ok(InnerRun { seconds: total - waited, blocked: waited, build, tests })
}

/// One edit-to-report: its time, and its parts.
struct InnerRun {
    seconds: f64,
    /// Blocked on another build's lock, not counted in `seconds`.
    blocked: f64,
    /// cargo's own `Finished ... in` time (with the blocked time in it).
    build: f64,
    /// libtest's `finished in` time.
    tests: f64,
}

pub fn inner_loop(ctx: &Context, runs: usize) -> Result<Row, String> {
    println!(
        "inner loop: building chapter_03's tests once (not timed), then {runs} scratch edits of {EXERCISE}"
    );
    chapter_test(ctx)?;
    let edit = ScratchEdit::begin(&ctx.root.join(EXERCISE))?;
    let mut measured = Vec::new();
    for run in 1..=runs {
        edit.apply(run)?;
        measured.push(chapter_test(ctx)?);
    }
    drop(edit);
    measured.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let median = &measured[measured.len() / 2];
    let waited: f64 = measured.iter().map(|run| run.blocked).sum();
    let blocked = if waited > 0.0 {
        format!("; not counted: {waited:.0} s blocked on other builds' lock")
    } else {
        String::new()
    };
    let (fastest, slowest) = (measured[0].seconds, measured[measured.len() - 1].seconds);
    Ok(Row {
        wait: "inner loop: a one-line edit of an exercise until `cargo test --test chapter_03` reports".into(),
        measured: format!("{:.1} s (median of {runs}; {fastest:.1} to {slowest:.1} s{blocked})", median.seconds),
        target: "under 10 s".into(),
        made_of: format!(
            "in the median run: cargo recompiles the crate (incremental, debug) and links chapter_03's test binary, \
             {:.1} s by cargo's Finished line; the tests run {:.2} s (they fail fast on the stubs); \
             the rest is cargo starting and checking what is fresh",
            median.build - median.blocked,
            median.tests
        ),
    })
}
