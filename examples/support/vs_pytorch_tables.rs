//! The tables of
//! examples/bench_vs_pytorch.rs, from the rates it measured: tokens per
//! second of each contender, the ratios per round, and the cost of
//! distribution of each side; and the file they are written to, with the
//! machine, its load, the date and the command. Included by bench_vs_pytorch.rs:
//! `cargo run --release --features mpi --example bench_vs_pytorch`.

use std::fmt::Write;

/// One run of a contender: its tokens per second (all ranks together) and
/// the time of one optimizer step, both over the timed steps.
#[derive(Clone, Copy)]
pub struct Rate {
    pub tokens_per_second: f64,
    pub step_ms: f64,
}

/// Median, min and max.
pub fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (sorted[sorted.len() / 2], sorted[0], sorted[sorted.len() - 1])
}

/// A contender's name and its rate in every round.
pub struct Column<'a> {
    pub name: &'a str,
    pub rates: &'a [Rate],
}

/// Per round, `f` of the two contenders' rates, then median, min and max.
fn per_round(a: &Column, b: &Column, f: impl Fn(&Rate, &Rate) -> f64) -> (f64, f64, f64) {
    summary(&a.rates.iter().zip(b.rates).map(|(a, b)| f(a, b)).collect::<Vec<_>>())
}

/// The tokens/s table, the ratios (`ratios`: numerator, denominator) and the
/// cost of distribution (`costs`: the 2-rank run, the 1-rank run on the same
/// per-rank work), as markdown.
pub fn training_tables(columns: &[Column], ratios: &[(usize, usize)], costs: &[(usize, usize)]) -> String {
    let mut out = String::from("| run | tokens/s median | min | max | step, median |\n");
    out += "| --- | ---: | ---: | ---: | ---: |\n";
    for column in columns {
        let (median, min, max) =
            summary(&column.rates.iter().map(|r| r.tokens_per_second).collect::<Vec<_>>());
        let step = summary(&column.rates.iter().map(|r| r.step_ms).collect::<Vec<_>>()).0;
        let _ = writeln!(out, "| {} | {median:.0} | {min:.0} | {max:.0} | {step:.2} ms |", column.name);
    }
    out += "\n| ratio of tokens/s, per round | median | min | max |\n| --- | ---: | ---: | ---: |\n";
    for &(a, b) in ratios {
        let (a, b) = (&columns[a], &columns[b]);
        let (median, min, max) = per_round(a, b, |a, b| a.tokens_per_second / b.tokens_per_second);
        let _ = writeln!(out, "| {} / {} | {median:.2}x | {min:.2}x | {max:.2}x |", a.name, b.name);
    }
    out += "\nThe cost of distribution: a 2-rank step's time minus a 1-rank step's time on the same \
            per-rank work (per round, then median, min and max).\n\n";
    out += "| 2 ranks | 1 rank | step, 2 ranks | step, 1 rank | cost, median | min | max |\n";
    out += "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n";
    for &(two, one) in costs {
        let (two, one) = (&columns[two], &columns[one]);
        let (median, min, max) = per_round(two, one, |a, b| a.step_ms - b.step_ms);
        let step = |c: &Column| summary(&c.rates.iter().map(|r| r.step_ms).collect::<Vec<_>>()).0;
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} ms | {:.2} ms | {median:.2} ms | {min:.2} ms | {max:.2} ms |",
            two.name,
            one.name,
            step(two),
            step(one)
        );
    }
    out
}

/// The all_reduce table: one row per size, one column per backend (seconds).
pub fn all_reduce_table(sizes_mib: &[f64], backends: &[(&str, Vec<f64>)]) -> String {
    let names: Vec<&str> = backends.iter().map(|(name, _)| *name).collect();
    let mut out = format!("| MiB | {} |\n| ---: |{}\n", names.join(" | "), " ---: |".repeat(names.len()));
    for (i, mib) in sizes_mib.iter().enumerate() {
        let cells: Vec<String> = backends.iter().map(|(_, s)| format!("{:.3} ms", s[i] * 1e3)).collect();
        let _ = writeln!(out, "| {mib} | {} |", cells.join(" | "));
    }
    out
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
