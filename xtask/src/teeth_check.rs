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
//!
//! Teeth judges the tests of the build without the `solutions` feature; a
//! test behind `#[cfg(feature = "solutions")]` does not exist there, so it
//! would never be judged (and one behind `not(feature = ...)` would never
//! run against the solutions). So the chapter's test list in that build
//! must equal its list in the solutions run's build, but for the controls
//! named in [`ONE_BUILD_ONLY`], each with its reason.
//! Run it: `cargo xtask test --only teeth`. Unit tests: xtask/tests/teeth.rs.

use std::fs::{self, File};
use std::process::Command;

use crate::cargo_json::{BuildOutcome, TestExecutable};
use crate::libtest_json::{failure_excerpt, SuiteTally};
use crate::process::describe_limit;
use crate::report::{Outcome, Report};
use crate::test_checks::CHAPTER_LIMIT;
use crate::test_executables::{self as executables, describe_end, print_errors};
use crate::Context;

/// The features of the solutions run (the `solutions` check), whose build
/// of the chapters teeth compares its own with.
pub const SOLUTIONS_FEATURES: &str = "solutions,mpi,nccl";

/// A chapter test that may exist in one of the two builds only.
#[derive(Clone, Copy, Debug)]
pub struct OneBuildOnly {
    /// The chapter's test target: `chapter_11`.
    pub chapter: &'static str,
    /// The test's libtest name: `controls::...` (only a control may be listed).
    pub test: &'static str,
    /// Why it cannot exist in both builds.
    pub reason: &'static str,
}

/// The chapter tests allowed in one build only. None today: every chapter
/// test exists with and without the solutions.
pub const ONE_BUILD_ONLY: &[OneBuildOnly] = &[];

/// The test names in the output of a test executable's `--list --format
/// terse` (`name: test` lines; benchmarks and anything else are left out).
pub fn listed_tests(output: &str) -> Vec<String> {
    let mut names: Vec<String> =
        output.lines().filter_map(|line| line.strip_suffix(": test")).map(str::to_string).collect();
    names.sort();
    names
}

/// What is wrong with chapter `chapter`'s tests in the two builds: `stubs`
/// (without the feature, what teeth judges) and `solutions` (what the
/// solutions run runs), as `--list` names them. A test in one only is
/// wrong unless `allowed` lists it for this chapter, as a control, with a
/// reason; a listed test that is in both builds, or in neither, is a stale
/// entry.
pub fn compare_builds(
    chapter: &str,
    stubs: &[String],
    solutions: &[String],
    allowed: &[OneBuildOnly],
) -> Vec<String> {
    let listed: Vec<&OneBuildOnly> = allowed.iter().filter(|entry| entry.chapter == chapter).collect();
    let is_listed = |name: &str| listed.iter().any(|entry| entry.test == name);
    let mut problems = vec![];
    for name in solutions.iter().filter(|name| !stubs.contains(name) && !is_listed(name)) {
        problems.push(format!(
            "{name}: exists only with --features {SOLUTIONS_FEATURES} (a #[cfg(feature = ...)] leaves it out \
             of the stubs' build), so teeth never judges it: make it exist in both builds, or, if it is a \
             control that must not, list it in ONE_BUILD_ONLY (xtask/src/teeth_check.rs) with the reason"
        ));
    }
    for name in stubs.iter().filter(|name| !solutions.contains(name) && !is_listed(name)) {
        problems.push(format!(
            "{name}: exists only without --features {SOLUTIONS_FEATURES}, so the solutions run never runs it: \
             make it exist in both builds, or, if it is a control that must not, list it in ONE_BUILD_ONLY \
             (xtask/src/teeth_check.rs) with the reason"
        ));
    }
    for entry in listed {
        let (name, in_stubs, in_solutions) =
            (entry.test, stubs.iter().any(|n| n == entry.test), solutions.iter().any(|n| n == entry.test));
        if !is_control(name) {
            problems.push(format!(
                "{name}: listed in ONE_BUILD_ONLY, but not in a `mod controls`: only a control, which never \
                 runs the learner's code, may exist in one build only"
            ));
        }
        if entry.reason.trim().is_empty() {
            problems.push(format!(
                "{name}: listed in ONE_BUILD_ONLY without a reason: say why it is in one build only"
            ));
        }
        if in_stubs == in_solutions {
            let where_ = if in_stubs { "in both builds" } else { "in neither build" };
            problems.push(format!(
                "{name}: listed in ONE_BUILD_ONLY ({}), but it is {where_}: remove the entry",
                entry.reason
            ));
        }
    }
    problems
}

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
    // And the solutions run's build of the same tests (in the full suite it
    // is already built), to compare the two lists of tests.
    let targets: Vec<&str> = chapters.iter().flat_map(|chapter| ["--test", chapter.as_str()]).collect();
    let outcome = build_chapters(ctx, "teeth-build.log", &targets);
    let with_solutions: Vec<&str> = ["--features", SOLUTIONS_FEATURES].into_iter().chain(targets).collect();
    let solutions_outcome = build_chapters(ctx, "teeth-solutions-build.log", &with_solutions);

    for chapter in &chapters {
        let nn = &chapter["chapter_".len()..];
        let name = format!("teeth {chapter}");
        let one_build_only = match compare_chapter_builds(ctx, chapter, &outcome, &solutions_outcome) {
            Ok(problems) => problems,
            Err(why) => {
                report.check(&name, Outcome::Fail, &why);
                continue;
            }
        };
        // A learner who has filled in an exercise has made its tests pass, as
        // intended: only untouched stubs are checked. CI's clean clone always is.
        if !ctx.ci && exercise_differs_from_head(ctx, nn) {
            let edited = format!("you have edited src/ch{nn}_*/exercise.rs (CI checks the committed stubs)");
            if one_build_only.is_empty() {
                report.check(&name, Outcome::Skip, &edited);
            } else {
                one_build_only.iter().for_each(|problem| println!("    drift  {problem}"));
                let detail = format!("{} tests in one build only (above); {edited}", one_build_only.len());
                report.check(&name, Outcome::Fail, &detail);
            }
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
        let mut teeth = judge(nn, &tally);
        teeth.drift.extend(one_build_only);
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

/// Builds the test targets `args` name (`--test chapter_01 ...`, with
/// features or without), its log in target/test-logs/`log_name`; what it
/// built, even when some failed (their errors are printed).
fn build_chapters(ctx: &Context, log_name: &str, args: &[&str]) -> BuildOutcome {
    let build_log = ctx.log(log_name);
    let built =
        File::create(&build_log).and_then(|mut log| executables::build(ctx, args, None, &mut log, false));
    match built {
        Ok((finished, outcome)) => {
            if !finished.success() {
                println!("the chapters did not all build (target/test-logs/{log_name}):");
                print_errors(&outcome, 30);
            }
            outcome
        }
        Err(error) => {
            println!("could not start cargo: {error}");
            Default::default()
        }
    }
}

/// [`compare_builds`] on chapter `chapter`'s two executables; an error
/// says why the lists could not be compared.
pub fn compare_chapter_builds(
    ctx: &Context,
    chapter: &str,
    stubs: &BuildOutcome,
    solutions: &BuildOutcome,
) -> Result<Vec<String>, String> {
    let find = |outcome: &BuildOutcome, build: &str| {
        let executable = outcome.executables.iter().find(|e| e.target_name == chapter);
        let executable =
            executable.ok_or_else(|| format!("its tests did not build {build} (errors above)"))?;
        list_tests(ctx, executable)
    };
    let stub_tests = find(stubs, "without the feature")?;
    let solution_tests = find(solutions, &format!("with --features {SOLUTIONS_FEATURES}"))?;
    Ok(compare_builds(chapter, &stub_tests, &solution_tests, ONE_BUILD_ONLY))
}

/// The tests `executable` holds, as `--list` names them.
fn list_tests(ctx: &Context, executable: &TestExecutable) -> Result<Vec<String>, String> {
    let listed = Command::new(&executable.path)
        .args(["--list", "--format", "terse"])
        .current_dir(&ctx.root)
        .env("CARGO_MANIFEST_DIR", &ctx.root)
        .output();
    let path = ctx.display(&executable.path).into_owned();
    match listed {
        Ok(output) if output.status.success() => Ok(listed_tests(&String::from_utf8_lossy(&output.stdout))),
        Ok(output) => Err(format!(
            "{path} --list ended with {}: {}",
            crate::process::describe_status(&output.status),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(error) => Err(format!("could not run {path} --list: {error}")),
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
