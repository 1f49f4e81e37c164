//! Reads what a test executable prints when run
//! with `--format json -Z unstable-options` (one JSON event per line), and
//! the plain `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines of
//! `cargo test --doc`. Unit tests: xtask/tests/libtest_json.rs.
//!
//! Why JSON: counting per test from events is exact, a failing test comes
//! with its own captured output, and the tests still running when a limit
//! stops the executable are known by name (they started and never ended).

use std::collections::BTreeSet;

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TestEvent {
    SuiteStarted {
        test_count: usize,
    },
    /// The suite's own totals; only sent when the harness ends normally.
    SuiteFinished {
        passed: usize,
        failed: usize,
        ignored: usize,
    },
    Started {
        name: String,
    },
    Passed {
        name: String,
    },
    /// `output` is what the test printed (its panic message included).
    Failed {
        name: String,
        output: String,
    },
    /// `reason` is the `#[ignore = "..."]` message, empty without one.
    Ignored {
        name: String,
        reason: String,
    },
    /// Benchmarks, "running for over 60 seconds" warnings, future events.
    Other,
}

/// Reads one line of libtest's JSON output; `None` when the line is not a
/// JSON event (a test that printed to stdout without capture, for instance).
pub fn parse_event(line: &str) -> Option<TestEvent> {
    let value: Value = serde_json::from_str(line).ok()?;
    let text = |key: &str| value.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let count = |key: &str| value.get(key).and_then(Value::as_u64).unwrap_or(0) as usize;
    // Every libtest line has a "type"; benchmark results have no "event".
    let event_name = value.get("event").and_then(Value::as_str).unwrap_or("");
    let event = match (value.get("type")?.as_str()?, event_name) {
        ("suite", "started") => TestEvent::SuiteStarted { test_count: count("test_count") },
        ("suite", "ok" | "failed") => TestEvent::SuiteFinished {
            passed: count("passed"),
            failed: count("failed"),
            ignored: count("ignored"),
        },
        ("test", "started") => TestEvent::Started { name: text("name") },
        ("test", "ok") => TestEvent::Passed { name: text("name") },
        ("test", "ignored") => TestEvent::Ignored { name: text("name"), reason: text("message") },
        ("test", "failed") => {
            // `message` explains a #[should_panic] that did not panic, or one
            // whose message did not match; `stdout` is the captured output.
            let parts: Vec<String> =
                [text("stdout"), text("message")].into_iter().filter(|s| !s.is_empty()).collect();
            TestEvent::Failed { name: text("name"), output: parts.join("\n") }
        }
        _ => TestEvent::Other,
    };
    Some(event)
}

/// The tally of one test executable's run.
#[derive(Debug, Default)]
pub struct SuiteTally {
    pub passed: usize,
    pub failed: usize,
    pub ignored: usize,
    /// Names of the tests that passed, in the order they finished.
    pub passed_names: Vec<String>,
    /// Name and output of each failed test, in the order they failed.
    pub failures: Vec<(String, String)>,
    /// Name and reason (the `#[ignore]` message, empty without one) of each
    /// ignored test, so that a skip is never silent.
    pub ignored_tests: Vec<(String, String)>,
    /// Tests that started and have not finished (yet, or ever: a crash or a
    /// hang leaves them here).
    pub running: BTreeSet<String>,
    /// The harness printed its closing event: it was not cut short.
    pub finished: bool,
    /// Lines that were not events: output printed past libtest's capture.
    pub other_lines: Vec<String>,
}

impl SuiteTally {
    pub fn record_line(&mut self, line: &str) {
        match parse_event(line) {
            Some(event) => self.record(event),
            None if line.trim().is_empty() => {}
            None => self.other_lines.push(line.to_string()),
        }
    }

    pub fn record(&mut self, event: TestEvent) {
        match event {
            TestEvent::Started { name } => {
                self.running.insert(name);
            }
            TestEvent::Passed { name } => {
                self.running.remove(&name);
                self.passed += 1;
                self.passed_names.push(name);
            }
            TestEvent::Ignored { name, reason } => {
                self.running.remove(&name);
                self.ignored += 1;
                self.ignored_tests.push((name, reason));
            }
            TestEvent::Failed { name, output } => {
                self.running.remove(&name);
                self.failed += 1;
                self.failures.push((name, output));
            }
            TestEvent::SuiteFinished { .. } => self.finished = true,
            TestEvent::SuiteStarted { .. } | TestEvent::Other => {}
        }
    }

    /// Whether `needle` appears in anything this run printed: the failed
    /// tests' output or the lines past the capture.
    pub fn output_contains(&self, needle: &str) -> bool {
        self.failures.iter().any(|(_, output)| output.contains(needle))
            || self.other_lines.iter().any(|line| line.contains(needle))
    }
}

/// Totals of a run's plain `test result:` lines, as (passed, failed, ignored).
pub fn sum_test_result_lines(output: &str) -> (usize, usize, usize) {
    let mut totals = (0, 0, 0);
    for line in output.lines().filter(|line| line.starts_with("test result: ")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            let Ok(number) = pair[0].parse::<usize>() else { continue };
            match pair[1].trim_end_matches(';') {
                "passed" => totals.0 += number,
                "failed" => totals.1 += number,
                "ignored" => totals.2 += number,
                _ => {}
            }
        }
    }
    totals
}

/// The part of a failed test's output a person needs first: each panic
/// message (the `panicked at` line and its message, without the backtrace
/// that RUST_BACKTRACE adds), or else the last lines; at most `max_lines`.
pub fn failure_excerpt(output: &str, max_lines: usize) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let mut excerpt: Vec<&str> = Vec::new();
    for (index, line) in lines.iter().enumerate().filter(|(_, line)| line.contains("panicked at")) {
        excerpt.push(line);
        let message = lines[index + 1..]
            .iter()
            .take_while(|line| !line.starts_with("stack backtrace:") && !line.starts_with("note: "))
            .take_while(|line| !line.contains("panicked at"));
        excerpt.extend(message);
    }
    if excerpt.is_empty() {
        excerpt = lines[lines.len().saturating_sub(max_lines)..].to_vec();
    }
    excerpt.truncate(max_lines);
    excerpt.join("\n")
}
