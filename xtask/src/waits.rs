//! `cargo xtask waits`, the learner's waits, measured
//! and printed with the machine's load, and written to docs/waits.md (which
//! README quotes):
//!
//! ```text
//! cargo xtask waits                        # inner loop and first output
//! cargo xtask waits --cold                 # also a kernel with no prebuilt crate (minutes)
//! cargo xtask waits --ci-log target/ci.log # also the README's two commands, from a log of `bash .ci/run`
//! ```
//!
//! The inner loop (waits_inner_loop.rs): a one-line scratch edit of
//! src/ch03_averaging/exercise.rs (a comment appended) until `cargo test
//! --test chapter_03` reports, `--runs` times (default 3). The file is
//! restored afterwards, on an error too, and a watchdog process restores it
//! if this command is killed (Ctrl-C); a later run also removes a scratch
//! line that anything left.
//! A notebook's first output: scripts/notebook_kernel.py first-output starts
//! a fresh kernel as Jupyter does and runs notebooks/00-introduction.ipynb
//! until a cell prints: once in the build folders a learner has (a kernel
//! that ran before), once in a new build folder started from set-up's
//! prebuilt crate (a learner's first kernel), and with `--cold` in a new
//! build folder with nothing prebuilt. Pure parts: waits_log.rs.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::cli::WaitsOptions;
use crate::process::run_logged;
use crate::waits_inner_loop::inner_loop;
use crate::waits_log::{largest_parts, markdown_table, parse_ci_log, plain_table, Row};
use crate::Context;

const NOTEBOOK: &str = "notebooks/00-introduction.ipynb";
const OUTPUT: &str = "docs/waits.md";

pub fn main(options: &WaitsOptions) -> ExitCode {
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(error) => {
            eprintln!("cargo xtask waits: cannot create target/test-logs/: {error}");
            return ExitCode::FAILURE;
        }
    };
    let (started_at, load_before) = (utc_now(), load_average());
    let mut rows = Vec::new();
    let mut failed = false;
    let mut add = |result: Result<Row, String>| match result {
        Ok(row) => {
            print!("{}", plain_table(std::slice::from_ref(&row)));
            rows.push(row);
        }
        Err(problem) => {
            println!("FAILED: {problem}");
            failed = true;
        }
    };
    add(inner_loop(&ctx, options.runs.get()));
    add(first_output(&ctx, "a notebook's first output, in a build folder used before", None));
    add(first_output(
        &ctx,
        "a notebook's first output, the first kernel after set-up",
        Some(Scratch::Seeded),
    ));
    if options.cold {
        add(first_output(&ctx, "a notebook's first output, nothing prebuilt (--cold)", Some(Scratch::Cold)));
    }
    if let Some(log) = &options.ci_log {
        match std::fs::read_to_string(log) {
            Ok(text) => rows.extend(ci_rows(&text, &ctx.display(log))),
            Err(error) => add(Err(format!("cannot read {}: {error}", log.display()))),
        }
    }
    let conditions = format!(
        "measured from {started_at} on {} cores, load average {} before and {} after (other builds share these cores: read the times as upper bounds)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_before,
        load_average()
    );
    println!("\n{conditions}");
    let page = format!(
        "<!-- Written by `cargo xtask waits` (xtask/src/waits.rs); do not edit by hand. -->\n\n\
         The learner's waits, {conditions}.\n\n{}",
        markdown_table(&rows)
    );
    if let Err(error) = std::fs::write(ctx.root.join(OUTPUT), page) {
        eprintln!("cargo xtask waits: cannot write {OUTPUT}: {error}");
        return ExitCode::FAILURE;
    }
    println!("written to {OUTPUT}");
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// A build-folder root for one measurement: `Seeded` holds only a link to
/// set-up's prebuilt seed (a learner's first kernel), `Cold` nothing.
enum Scratch {
    Seeded,
    Cold,
}

fn first_output(ctx: &Context, wait: &str, scratch: Option<Scratch>) -> Result<Row, String> {
    println!("{wait}: running {NOTEBOOK} until a cell prints");
    let python = ctx.root.join(".venv/bin/python");
    let mut command = Command::new(&python);
    command.current_dir(&ctx.root).args(["scripts/notebook_kernel.py", "first-output", NOTEBOOK, "--json"]);
    if let Some(kind) = scratch {
        // Beside the learner's build folders, never inside the repository:
        // evcxr's cargo would take the repository's Cargo.toml for its workspace.
        let seed = seed_folder(&python, &ctx.root)?;
        let root = seed.parent().ok_or("the seed folder has no parent")?.join("waits-evcxr");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| format!("cannot make {}: {e}", root.display()))?;
        if let Scratch::Seeded = kind {
            if !seed.join("ready").is_file() {
                return Err(format!("no prebuilt crate in {}: run scripts/setup.sh", seed.display()));
            }
            for name in ["seed", "seed.lock"] {
                let target = seed.with_file_name(name);
                std::os::unix::fs::symlink(&target, root.join(name))
                    .map_err(|e| format!("cannot link {name}: {e}"))?;
            }
        }
        command.args(["--cache".as_ref(), root.as_os_str()]);
    }
    let captured = run_logged(command, None, &ctx.log("waits-first-output.log"), false)
        .map_err(|e| format!("cannot run scripts/notebook_kernel.py: {e}"))?;
    let json = captured.output.lines().find_map(|line| line.strip_prefix("first-output-json: "));
    let record: serde_json::Value = json.and_then(|j| serde_json::from_str(j).ok()).ok_or_else(|| {
        "scripts/notebook_kernel.py printed no result (log: target/test-logs/waits-first-output.log)"
            .to_string()
    })?;
    let parts: Vec<String> = record["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|part| format!("{} {:.1} s", part[0].as_str().unwrap_or("?"), part[1].as_f64().unwrap_or(0.0)))
        .collect();
    Ok(Row {
        wait: wait.to_string(),
        measured: format!("{:.1} s", record["seconds"].as_f64().unwrap_or(f64::NAN)),
        target: "under 20 s".into(),
        made_of: parts.join("; "),
    })
}

/// The seed folder the kernel's launcher uses (`launch.sh --print-seed`).
fn seed_folder(python: &Path, root: &Path) -> Result<PathBuf, String> {
    let output = Command::new(python)
        .current_dir(root)
        .args(["-c", "from jupyter_client.kernelspec import KernelSpecManager as K; print(K().get_kernel_spec('ddp-workbook').resource_dir)"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let kernel_dir = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let printed =
        Command::new("bash").arg(Path::new(&kernel_dir).join("launch.sh")).arg("--print-seed").output();
    match printed {
        Ok(out) if out.status.success() => Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or(""))),
        _ => Err("the notebook kernel is not installed (or is older than its prebuilt crate): run scripts/setup.sh".into()),
    }
}

fn ci_rows(text: &str, log: &str) -> Vec<Row> {
    let parsed = parse_ci_log(text);
    let minutes = |s: Option<u64>| {
        s.map_or("not in the log".to_string(), |s| format!("{s} s ({:.1} min)", s as f64 / 60.0))
    };
    let both = parsed.setup_seconds.zip(parsed.suite_seconds).map(|(a, b)| a + b);
    vec![
        Row {
            wait: format!("`scripts/setup.sh` (from {log})"),
            measured: minutes(parsed.setup_seconds),
            target: "with the suite, under 15 min".into(),
            made_of: largest_parts(&parsed.setup_steps, 6),
        },
        Row {
            wait: format!("`scripts/test.sh` (from {log})"),
            measured: minutes(parsed.suite_seconds),
            target: "with set-up, under 15 min".into(),
            made_of: largest_parts(&parsed.suite_checks, 8),
        },
        Row {
            wait: "the README's two commands together".into(),
            measured: minutes(both),
            target: "under 15 min".into(),
            made_of: "the two rows above".into(),
        },
    ]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn utc_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_else(|_| "at an unknown time".into())
}
