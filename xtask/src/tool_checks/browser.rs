//! The `browser` check. The book in a real
//! browser: first the checker's own test (scripts/test_check_book_in_browser.py:
//! it must catch every problem planted in scripts/testdata/browser_book/),
//! then `mdbook build` and scripts/check_book_in_browser.py on book/, which
//! opens every page in headless Chromium (Debian's package, installed by
//! scripts/setup.sh) from a loopback server and fails on a page that does
//! not load, an image that does not render, a broken link or anchor, a
//! script error or `console.error`, a file that fails to load, or a request
//! to another address; it saves the README's screenshots to docs/screenshots/.
//! Run it: `cargo xtask test --only browser`.

use std::process::Command;
use std::time::Duration;

use super::{find_mdbook, run_or_fail};
use crate::process;
use crate::report::{Outcome, Report};
use crate::Context;

/// In CI, the longest either script may take (the whole book takes well
/// under a minute on 2 busy cores).
const BROWSER_LIMIT: Duration = Duration::from_secs(10 * 60);

/// Where the screenshots the README shows are saved, from the root.
pub const SCREENSHOTS: &str = "docs/screenshots";

pub fn browser(ctx: &Context, report: &mut Report) {
    report.section("the book in headless Chromium: every page loads, every image renders, every link and anchor resolves, no script error");
    let venv_python = ctx.root.join(".venv/bin/python");
    let python = if venv_python.is_file() { venv_python } else { "python3".into() };
    let script = |args: &[&str]| {
        let mut command = Command::new(&python);
        command.args(args).current_dir(&ctx.root);
        command
    };

    // The checker must first prove that it sees each kind of problem.
    let command = script(&["scripts/test_check_book_in_browser.py"]);
    let log = ctx.log("browser-self-test.log");
    let Some(captured) = run_or_fail(report, "browser", command, ctx.limit(BROWSER_LIMIT), log, false) else {
        return;
    };
    if !captured.finished.success() {
        process::print_last_lines(&captured.output, 40);
        let detail = "the checker missed a planted problem, or Chromium is missing (run scripts/setup.sh); log: target/test-logs/browser-self-test.log";
        return report.check("browser", Outcome::Fail, detail);
    }

    let Some(mdbook) = find_mdbook() else {
        return report.check("browser", Outcome::Fail, "mdbook is not installed: run scripts/setup.sh");
    };
    let mut command = Command::new(mdbook);
    command.arg("build").current_dir(&ctx.root);
    let Some(built) = run_or_fail(report, "browser", command, None, ctx.log("browser-mdbook.log"), false)
    else {
        return;
    };
    if !built.finished.success() {
        println!("{}", built.output.trim_end());
        return report.check("browser", Outcome::Fail, "mdbook build failed (see above)");
    }

    let command =
        script(&["scripts/check_book_in_browser.py", "--book", "book", "--screenshots", SCREENSHOTS]);
    let log = ctx.log("browser.log");
    let Some(captured) = run_or_fail(report, "browser", command, ctx.limit(BROWSER_LIMIT), log, false) else {
        return;
    };
    let summary = process::last_lines(&captured.output, 1);
    if captured.finished.success() {
        report.check("browser", Outcome::Ok, &format!("{summary}; screenshots in {SCREENSHOTS}/"));
    } else {
        captured
            .output
            .lines()
            .filter(|line| line.starts_with("PROBLEM"))
            .take(40)
            .for_each(|line| println!("{line}"));
        process::print_last_lines(&captured.output, 3);
        let detail = format!("{summary} (every problem: target/test-logs/browser.log)");
        report.check("browser", Outcome::Fail, &detail);
    }
}
