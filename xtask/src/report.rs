//! Counts the checks and prints one line per check and
//! the closing summary, `N passed, N failed[, N skipped]`, which CI reads as
//! the last line of `cargo xtask test` (and so of scripts/test.sh).
//!
//! Counting rules (the same as scripts/test.sh has always used): each test of
//! the solutions run counts on its own (an ignored test counts as skipped),
//! each notebook counts on its own, and every other check counts once (one
//! teeth check per chapter). A check left out with `--only`/`--skip`, or one
//! that cannot run without libtorch, counts once as skipped.

use std::time::Instant;

use crate::expected_skips::Skipped;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Skip,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        }
    }
}

pub struct Report {
    passed: usize,
    failed: usize,
    skipped: usize,
    /// Names for the `failed: ...` line above the summary.
    failed_names: Vec<String>,
    /// Every skip by name, for tests/expected_skips.toml's judgement.
    skips: Vec<Skipped>,
    section_start: Instant,
}

impl Default for Report {
    fn default() -> Self {
        Self::new()
    }
}

impl Report {
    pub fn new() -> Self {
        Report {
            passed: 0,
            failed: 0,
            skipped: 0,
            failed_names: Vec::new(),
            skips: Vec::new(),
            section_start: Instant::now(),
        }
    }

    /// Starts a section: a `==> title` header; the seconds on the check lines
    /// that follow count from here.
    pub fn section(&mut self, title: &str) {
        println!("\n==> {title}");
        self.section_start = Instant::now();
    }

    /// Counts one check and prints its line: `OK    fmt     3s  detail`.
    pub fn check(&mut self, name: &str, outcome: Outcome, detail: &str) {
        match outcome {
            Outcome::Ok => self.passed += 1,
            Outcome::Fail => {
                self.failed += 1;
                self.failed_names.push(name.to_string());
            }
            Outcome::Skip => {
                self.skipped += 1;
                self.skips.push(Skipped {
                    target: "check".to_string(),
                    name: name.to_string(),
                    reason: detail.to_string(),
                });
            }
        }
        self.print_line(outcome.label(), name, detail);
    }

    /// Names one skipped test of executable `target` (counted with
    /// `add_counts`), so that the expected-skips list can judge it.
    pub fn name_skipped_test(&mut self, target: &str, name: &str, reason: &str) {
        self.skips.push(Skipped {
            target: target.to_string(),
            name: name.to_string(),
            reason: reason.to_string(),
        });
    }

    /// Every test and check counted so far: passed, failed and skipped.
    pub fn counted(&self) -> usize {
        self.passed + self.failed + self.skipped
    }

    pub fn skipped(&self) -> usize {
        self.skipped
    }

    pub fn skips(&self) -> &[Skipped] {
        &self.skips
    }

    /// Adds counts that come from many items at once (tests, notebooks):
    /// `label` goes on the `failed:` line when some of them failed.
    pub fn add_counts(&mut self, passed: usize, failed: usize, skipped: usize, label: &str) {
        self.passed += passed;
        self.failed += failed;
        self.skipped += skipped;
        if failed > 0 {
            self.failed_names.push(format!("{label}:{failed}"));
        }
    }

    /// A line in the check format that counts nothing (`----`): the totals
    /// of a section whose items were counted with `add_counts`.
    pub fn tally_line(&self, name: &str, detail: &str) {
        self.print_line("----", name, detail);
    }

    fn print_line(&self, label: &str, name: &str, detail: &str) {
        let seconds = self.section_start.elapsed().as_secs();
        let line = format!("{label:<4}  {name:<18} {seconds:>4}s  {detail}");
        println!("{}", line.trim_end());
    }

    pub fn failed(&self) -> usize {
        self.failed
    }

    /// The closing line CI reads; `N skipped` only when something was.
    pub fn summary_line(&self) -> String {
        if self.skipped > 0 {
            format!("{} passed, {} failed, {} skipped", self.passed, self.failed, self.skipped)
        } else {
            format!("{} passed, {} failed", self.passed, self.failed)
        }
    }

    /// Prints the `failed:` line (if any) and the summary, last.
    pub fn print_summary(&self) {
        println!();
        if !self.failed_names.is_empty() {
            println!("failed: {}  (logs in target/test-logs/)", self.failed_names.join(" "));
        }
        println!("{}", self.summary_line());
    }
}
