//! The table files the benchmarks write under
//! chapters/tables/, which the book includes instead of pasting numbers: a
//! Markdown table, then a caption list of the settings, the machine (cores,
//! CPU, kernel), the date, the load average before and after, the command
//! that wrote it and how long it took. One writer for every benchmark, so
//! that every table says the same things about how it was measured, and
//! writes its numbers the same way (median with min and max, thousands).
//! Included by each benchmark that writes one with
//! `#[path = "support/table_file.rs"] mod table_file;`.

use std::time::{Duration, Instant};

/// One run of a benchmark, from its start: the loads it noted and its duration.
pub struct Run {
    started: Instant,
    /// (when, the 1, 5 and 15-minute load averages), the first "before".
    loads: Vec<(String, String)>,
}

impl Run {
    /// Notes the load and the time: call it before the first measurement.
    pub fn start() -> Run {
        Run { started: Instant::now(), loads: vec![("before".into(), load_averages())] }
    }

    /// Notes the load now, under `when` ("after the training runs"), for a
    /// command whose parts meet different loads.
    #[allow(dead_code)] // bench_vs_pytorch's: its training runs and its all_reduce timings
    pub fn note_load(&mut self, when: &str) {
        self.loads.push((when.into(), load_averages()));
    }

    /// The caption list: one line per setting, the machine and the date,
    /// the loads noted and the load now ("after"), the command and how long
    /// the run took so far.
    pub fn caption(&self, settings: &[String], command: &str) -> String {
        let took = Duration::from_secs(self.started.elapsed().as_secs());
        let mut out: String = settings.iter().map(|s| format!("- {s}\n")).collect();
        out += &format!(
            "- machine: {}\n- load average (1, 5, 15 min) {}\n- `{command}` took {took:?}\n",
            machine_line(),
            self.loads()
        );
        out
    }

    /// The loads noted, then the load now ("after"): "before: 1.02 0.88
    /// 0.91; after: ...".
    pub fn loads(&self) -> String {
        let mut loads: Vec<String> =
            self.loads.iter().map(|(when, load)| format!("{when}: {load}")).collect();
        loads.push(format!("after: {}", load_averages()));
        loads.join("; ")
    }
}

/// The command that runs this program with the arguments it was given:
/// `cargo` (e.g. "cargo run --release --example bench_overlap"), then `--`
/// and the arguments, if any.
pub fn command_line(cargo: &str) -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        cargo.to_string()
    } else {
        format!("{cargo} -- {}", args.join(" "))
    }
}

/// The 1, 5 and 15-minute load averages (Linux), space-separated.
fn load_averages() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let loads: Vec<&str> = text.split_whitespace().take(3).collect();
    if loads.is_empty() {
        "unknown".into()
    } else {
        loads.join(" ")
    }
}

/// The machine in words: cores, CPU model, kernel, and the date (UTC).
pub fn machine_line() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = std::process::Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]).output();
    let date = date.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    let machine =
        format!("{cores} cores ({}), Linux {}; {date}", model.unwrap_or("unknown CPU"), kernel.trim());
    format!("{machine}; this process's scheduling: {}", scheduling())
}

/// How this process is scheduled (inherited by the runs it starts): normal,
/// or real time (`chrt -r 1 ...`), where the machine's other work waits.
fn scheduling() -> String {
    // /proc/self/stat: fields 40 and 41 (1-based) are rt_priority and policy;
    // the command name (field 2) may hold spaces, so count after its ')'.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    match (fields.get(37), fields.get(38)) {
        (Some(priority), Some(&"1")) => format!("real time, SCHED_FIFO priority {priority}"),
        (Some(priority), Some(&"2")) => {
            format!("real time, SCHED_RR priority {priority} (chrt -r {priority})")
        }
        (_, Some(_)) => "normal (other work on the machine shares the cores)".into(),
        _ => "unknown".into(),
    }
}

/// Writes `body` to `path` (relative to the repository) under a comment that
/// names the command, and returns the path written.
pub fn write_table(path: &str, command: &str, body: &str) -> anyhow::Result<std::path::PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = format!("<!-- Written by `{command}`; run it again to refresh. -->\n\n{body}");
    std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Median, min and max of `values` (the upper middle for an even count),
/// how the tables sum up a benchmark's rounds.
#[allow(dead_code)] // bench_scaling's and bench_vs_pytorch's
pub fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

/// 61834.2 -> "61,834": a whole number with its thousands marked.
#[allow(dead_code)] // bench_scaling's and bench_sync's
pub fn thousands(value: f64) -> String {
    let digits = format!("{value:.0}");
    let (sign, digits) = digits.split_at(if digits.starts_with('-') { 1 } else { 0 });
    let mut out = sign.to_string();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
