//! The pieces of `cargo xtask waits` that only read
//! text: what a log of the README's two commands (`bash .ci/run`, that is
//! scripts/setup.sh then scripts/test.sh) says each part took, the scratch
//! edit of the inner-loop measurement, and the table the command prints and
//! writes. Unit tests: xtask/tests/waits.rs (`cargo test -p xtask`).

/// The line `cargo xtask waits` appends to an exercise for one measurement
/// of the inner loop; every line holding it is removed afterwards.
pub const SCRATCH_MARK: &str = "// cargo xtask waits: a scratch edit, removed when it finishes";

/// The text without any line holding [`SCRATCH_MARK`] (a run that was
/// killed may have left one), or `None` when there is none.
pub fn without_scratch_edit(text: &str) -> Option<String> {
    if !text.contains(SCRATCH_MARK) {
        return None;
    }
    Some(text.split_inclusive('\n').filter(|line| !line.contains(SCRATCH_MARK)).collect())
}

/// The seconds in cargo's `Finished `test` profile [...] target(s) in 1m 02s`
/// (or `in 3.45s`): how long it compiled.
pub fn cargo_build_seconds(line: &str) -> Option<f64> {
    let rest = line.trim().strip_prefix("Finished ")?.rsplit_once(" in ")?.1;
    match rest.split_once("m ") {
        Some((minutes, seconds)) => {
            Some(minutes.parse::<f64>().ok()? * 60.0 + seconds.strip_suffix('s')?.parse::<f64>().ok()?)
        }
        None => rest.strip_suffix('s')?.parse().ok(),
    }
}

/// The seconds in libtest's `test result: ... finished in 0.05s`: how long
/// the tests ran.
pub fn test_run_seconds(line: &str) -> Option<f64> {
    line.strip_prefix("test result:")?.rsplit_once("finished in ")?.1.trim().strip_suffix('s')?.parse().ok()
}

/// One timed part of a log: a set-up step or a check of the suite.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub name: String,
    pub seconds: u64,
}

/// What a log of `bash .ci/run` says: the set-up's steps and total, the
/// suite's checks and total. A part missing from the log stays empty.
#[derive(Debug, Default, PartialEq)]
pub struct CiLog {
    pub setup_steps: Vec<Part>,
    pub setup_seconds: Option<u64>,
    pub suite_checks: Vec<Part>,
    pub suite_seconds: Option<u64>,
}

/// Reads the lines scripts/setup.sh, scripts/setup_notebooks.sh and the
/// runner print: `==> [3/10] title` ... `    [3/10] took 12s`;
/// `==> notebooks: title` ... `    notebooks: took 40s`; `Set-up complete
/// in 66s`; the runner's check lines `OK    name   230s  detail` (seconds
/// since their section began, so a section lasts as long as its largest);
/// `cargo xtask test took 858s`.
pub fn parse_ci_log(text: &str) -> CiLog {
    let mut log = CiLog::default();
    // The titles of the set-up step and of setup_notebooks.sh's section
    // being read: each `took` line belongs to its own kind of title.
    let (mut step, mut section): (Option<String>, Option<String>) = (None, None);
    let mut in_suite = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(rest) = line.strip_prefix("==> ").filter(|_| !in_suite) {
            match rest.strip_prefix("notebooks: ") {
                Some(title) => section = Some(format!("notebooks: {title}")),
                None => step = Some(step_title(rest)),
            }
            continue;
        }
        if let Some(seconds) = between(trimmed, "Set-up complete in ", "s") {
            log.setup_seconds = Some(seconds);
            in_suite = true;
        } else if let Some(seconds) = between(trimmed, "cargo xtask test took ", "s") {
            log.suite_seconds = Some(seconds);
        } else if !in_suite && (trimmed.contains("] took ") || trimmed.starts_with("notebooks: took ")) {
            let title = if trimmed.starts_with("notebooks: ") { &section } else { &step };
            if let (Some(title), Some(seconds)) = (title, trimmed.rsplit(' ').next().and_then(seconds_of)) {
                log.setup_steps.push(Part { name: title.clone(), seconds });
            }
        } else if in_suite {
            if let Some(part) = check_line(line) {
                match log.suite_checks.iter_mut().find(|p| p.name == part.name) {
                    Some(known) => known.seconds = known.seconds.max(part.seconds),
                    None => log.suite_checks.push(part),
                }
            }
        }
    }
    log
}

/// `[3/10] PyTorch ...` -> `PyTorch ...`.
fn step_title(header: &str) -> String {
    match header.split_once("] ") {
        Some((number, title)) if number.starts_with('[') => title.to_string(),
        _ => header.to_string(),
    }
}

/// `12s` -> 12.
fn seconds_of(word: &str) -> Option<u64> {
    word.strip_suffix('s')?.parse().ok()
}

/// The number between `prefix` and `suffix` at the start of `line`.
fn between(line: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let rest = line.strip_prefix(prefix)?;
    let end = rest.find(|c: char| !c.is_ascii_digit())?;
    rest[end..].starts_with(suffix).then(|| rest[..end].parse().ok())?
}

/// A runner line `OK    teeth chapter_01     22s  ...`: the check's name
/// (its first word: `teeth`) and the seconds.
fn check_line(line: &str) -> Option<Part> {
    let mut words = line.split_whitespace();
    if !matches!(words.next()?, "OK" | "FAIL" | "SKIP" | "----") {
        return None;
    }
    let name = words.next()?.to_string();
    let seconds = words.find_map(seconds_of)?;
    Some(Part { name, seconds })
}

/// The parts, largest first, as `name 230 s, name 79 s, ...` (at most `count`).
pub fn largest_parts(parts: &[Part], count: usize) -> String {
    let mut sorted: Vec<&Part> = parts.iter().filter(|p| p.seconds > 0).collect();
    sorted.sort_by_key(|part| std::cmp::Reverse(part.seconds));
    let named: Vec<String> =
        sorted.iter().take(count).map(|p| format!("{} {} s", p.name, p.seconds)).collect();
    if named.is_empty() {
        "(the log holds no per-part times)".to_string()
    } else {
        named.join(", ")
    }
}

/// One row of the table: a wait, what it measured, its target, and what it
/// is made of.
#[derive(Debug, Clone)]
pub struct Row {
    pub wait: String,
    pub measured: String,
    pub target: String,
    pub made_of: String,
}

/// The table as Markdown, for docs/waits.md.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut text =
        String::from("| wait | measured | target | what it is made of |\n| --- | --- | --- | --- |\n");
    for row in rows {
        let cells =
            [&row.wait, &row.measured, &row.target, &row.made_of].map(|cell| cell.replace('|', "\\|"));
        text.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    text
}

/// The table for a terminal: one block per wait.
pub fn plain_table(rows: &[Row]) -> String {
    rows.iter()
        .map(|row| {
            format!(
                "{}\n    measured {}  (target {})\n    made of: {}\n",
                row.wait, row.measured, row.target, row.made_of
            )
        })
        .collect::<Vec<_>>()
        .join("")
}
