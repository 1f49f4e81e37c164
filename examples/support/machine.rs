//! What the benchmark examples print about the
//! machine next to their timings. Included by each benchmark with
//! `#[path = "support/machine.rs"] mod machine;` (a folder without a
//! `main.rs`, so cargo does not take it for an example of its own).

/// The 1-minute load average (Linux), to print next to timings taken on a
/// machine that may be busy with other work.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}
