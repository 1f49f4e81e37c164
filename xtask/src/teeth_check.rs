//! The `teeth` check. On the untouched exercise
//! stubs, every test of a chapter must do one of two things:
//!
//! - reach the learner's code: fail, with `exercise chNN:` (the stub's
//!   `todo!` message) in its own output;
//! - or be a control, declared by living in the chapter's `mod controls`
//!   (libtest names it `controls::...`): a test of the test itself, such as
//!   a fake all-reduce that the checks must catch, which never runs the
//!   learner's code and so passes on the stubs.
//!
//! Anything else is drift, and fails the chapter: a test that passes on the
//! stubs proves nothing about the learner's code, and one that fails for
//! another reason would fail for a learner whose code is right.
//! Run it: `cargo xtask test --only teeth`. Unit tests: xtask/tests/teeth.rs.

use std::fs::{self, File};
use std::process::Command;

use crate::libtest_json::{failure_excerpt, SuiteTally};
use crate::process::describe_limit;
use crate::report::{Outcome, Report};
use crate::test_checks::CHAPTER_LIMIT;
use crate::test_executables::{self as executables, describe_end, print_errors};
use crate::Context;

/// A control: a test inside a module named `controls`, at any depth.
pub fn is_control(test_name: &str) -> bool {
    let modules = test_name.rsplit_once("::").map_or("", |(modules, _function)| modules);
    modules.split("::").any(|module| module == "controls")
}

/// What one chapter's run on the stubs shows, test by test.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChapterTeeth {
    /// Tests that failed naming `exercise chNN:`: they reach the exercise.
    pub reaching: Vec<String>,
    /// Controls that passed, as controls must.
    pub controls: Vec<String>,
    /// `name: what is wrong`, one per test that is neither.
    pub drift: Vec<String>,
}

impl ChapterTeeth {
    /// The chapter's line: how many tests reach the exercise, how many are
    /// controls.
    pub fn counts(&self, nn: &str) -> String {
        let reaching = match self.reaching.len() {
            1 => "1 test reaches".to_string(),
            count => format!("{count} tests reach"),
        };
        let controls = match self.controls.len() {
            1 => "1 control passes".to_string(),
            count => format!("{count} controls pass"),
        };
        format!("{reaching} the exercise (each fails naming 'exercise ch{nn}:'), {controls}")
    }
}

/// Sorts each test of chapter `nn`'s run on the stubs into reaching, control
/// or drift. A chapter where no test reaches the exercise drifts as a whole.
pub fn judge(nn: &str, tally: &SuiteTally) -> ChapterTeeth {
    let marker = format!("exercise ch{nn}:");
    let mut teeth = ChapterTeeth::default();
    let excerpt = |output: &str| failure_excerpt(output, 3).lines().collect::<Vec<_>>().join(" | ");
    for name in &tally.passed_names {
        if is_control(name) {
            teeth.controls.push(name.clone());
        } else {
            teeth.drift.push(format!(
                "{name}: passes on the untouched stubs, so it never reaches the exercise \
                 (make it run the learner's code, or move it into the chapter's `mod controls`)"
            ));
        }
    }
    for (name, output) in &tally.failures {
        match (is_control(name), output.contains(&marker)) {
            (false, true) => teeth.reaching.push(name.clone()),
            (false, false) => teeth.drift.push(format!(
                "{name}: fails on the stubs without naming '{marker}' in its own output, \
                 so it fails for another reason: {}",
                excerpt(output)
            )),
            (true, true) => teeth.drift.push(format!(
                "{name}: a control that reaches the exercise (it fails naming '{marker}'): \
                 move it out of `mod controls`"
            )),
            (true, false) => {
                teeth.drift.push(format!("{name}: a control that fails on the stubs: {}", excerpt(output)))
            }
        }
    }
    for (name, reason) in &tally.ignored_tests {
        teeth.drift.push(format!(
            "{name}: ignored ({reason}), so teeth cannot tell what it reaches: a chapter test must run"
        ));
    }
    for name in &tally.running {
        teeth.drift.push(format!("{name}: never finished (the test executable crashed or hung in it)"));
    }
    if teeth.reaching.is_empty() {
        teeth.drift.push(format!("no test fails naming '{marker}': nothing checks the exercise"));
    }
    teeth
}

/// The chapters that have tests: `chapter_01` for tests/chapter_01.rs.
pub fn chapter_targets(ctx: &Context) -> Vec<String> {
    let Ok(entries) = fs::read_dir(ctx.root.join("tests")) else { return Vec::new() };
    let mut chapters: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.strip_suffix(".rs").map(str::to_string))
        .filter(|stem| {
            stem.strip_prefix("chapter_")
                .is_some_and(|nn| nn.len() == 2 && nn.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    chapters.sort();
    chapters
}

pub fn teeth(ctx: &Context, report: &mut Report) {
    report.section(
        "teeth: on the untouched stubs, each chapter test fails naming its exercise, or is a control",
    );
    let chapters = chapter_targets(ctx);
    if chapters.is_empty() {
        let detail = "no tests/chapter_NN.rs found: the chapters' tests are missing";
        return report.check("teeth", Outcome::Fail, detail);
    }
    // One build for every chapter, without the feature; each run reuses it.
    let build_log = ctx.log("teeth-build.log");
    let args: Vec<&str> = chapters.iter().flat_map(|chapter| ["--test", chapter.as_str()]).collect();
    let built =
        File::create(&build_log).and_then(|mut log| executables::build(ctx, &args, None, &mut log, false));
    let outcome = match built {
        Ok((finished, outcome)) => {
            if !finished.success() {
                println!("the chapters did not all build (target/test-logs/teeth-build.log):");
                print_errors(&outcome, 30);
            }
            outcome
        }
        Err(error) => {
            println!("could not start cargo: {error}");
            Default::default()
        }
    };

    for chapter in &chapters {
        let nn = &chapter["chapter_".len()..];
        let name = format!("teeth {chapter}");
        // A learner who has filled in an exercise has made its tests pass, as
        // intended: only untouched stubs are checked. CI's clean clone always is.
        if !ctx.ci && exercise_differs_from_head(ctx, nn) {
            let detail = format!("you have edited src/ch{nn}_*/exercise.rs (CI checks the committed stubs)");
            report.check(&name, Outcome::Skip, &detail);
            continue;
        }
        let Some(executable) = outcome.executables.iter().find(|e| &e.target_name == chapter) else {
            report.check(&name, Outcome::Fail, "its tests did not build without the feature (errors above)");
            continue;
        };
        let log_path = ctx.log(&format!("teeth-{chapter}.log"));
        let ran = File::create(&log_path)
            .and_then(|mut log| executables::run(ctx, executable, &[], ctx.limit(CHAPTER_LIMIT), &mut log));
        let (finished, tally) = match ran {
            Ok(ran) => ran,
            Err(error) => {
                let detail = format!("could not run {}: {error}", executable.path.display());
                report.check(&name, Outcome::Fail, &detail);
                continue;
            }
        };
        if finished.timed_out {
            let detail = format!("hangs on the stubs (stopped after {})", describe_limit(CHAPTER_LIMIT));
            report.check(&name, Outcome::Fail, &detail);
            continue;
        }
        let teeth = judge(nn, &tally);
        let counts = teeth.counts(nn);
        if !tally.finished {
            // Without its closing event the run's tests cannot all be judged.
            crate::process::print_last_lines(&tally.other_lines.join("\n"), 20);
            let detail = format!("crashed on the stubs ({}); {counts}", describe_end(&finished, &tally));
            report.check(&name, Outcome::Fail, &detail);
        } else if teeth.drift.is_empty() {
            report.check(&name, Outcome::Ok, &counts);
        } else {
            teeth.drift.iter().for_each(|problem| println!("    drift  {problem}"));
            println!("    (log: {}; again: cargo test --test {chapter})", ctx.display(&log_path));
            let detail = format!("{} problems (above); {counts}", teeth.drift.len());
            report.check(&name, Outcome::Fail, &detail);
        }
    }
}

/// Whether the chapter's exercise.rs differs from the last commit. When git
/// cannot tell (no repository), the chapter is treated as edited, as before.
fn exercise_differs_from_head(ctx: &Context, nn: &str) -> bool {
    let status = Command::new("git")
        .args(["diff", "--quiet", "HEAD", "--"])
        .arg(format!("src/ch{nn}_*/exercise.rs")) // a pathspec: git expands the *
        .current_dir(&ctx.root)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    !matches!(status, Ok(status) if status.success())
}
