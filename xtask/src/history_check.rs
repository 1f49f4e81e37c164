//! `history`: a commit's subject line fits the 72 columns that `git log
//! --oneline`, shortlogs and review tools show, so the history reads as a
//! list of what changed; measurements and reasons belong in the body. The
//! rule holds for the commits after `SINCE`, the last commit made before
//! it was adopted (older subjects stay as they were written).

use std::path::Path;
use std::process::Command;

use crate::report::{Outcome, Report};
use crate::Context;

/// The longest subject line allowed, in characters.
pub const MAX_SUBJECT: usize = 72;

/// The last commit before the rule: commits after it are checked.
pub const SINCE: &str = "1a97e2b";

/// The commits among `commits` (hash, subject) whose subject is too long,
/// as lines that name the commit, the length and the subject.
pub fn long_subjects(commits: &[(String, String)]) -> Vec<String> {
    commits
        .iter()
        .filter(|(_, subject)| subject.chars().count() > MAX_SUBJECT)
        .map(|(hash, subject)| {
            let length = subject.chars().count();
            format!("{hash}: {length} characters, over {MAX_SUBJECT}: {subject}")
        })
        .collect()
}

/// The commits after `since` up to HEAD in the repository at `root`, as
/// (short hash, subject), newest first.
pub fn commits_since(root: &Path, since: &str) -> Result<Vec<(String, String)>, String> {
    let output = Command::new("git")
        .current_dir(root)
        .args(["log", "--format=%h%x09%s", &format!("{since}..HEAD")])
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git log {since}..HEAD failed ({}): a shallow clone lacks the commit the rule starts \
             after; fetch the whole history (git fetch --unshallow) and run the check again",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let commits = text
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(hash, subject)| (hash.to_string(), subject.to_string()))
        .collect();
    Ok(commits)
}

/// The check as the suite runs it: each long subject on its own line, then
/// one verdict.
pub fn history(ctx: &Context, report: &mut Report) {
    report.section("history: every commit's subject fits 72 characters");
    let commits = match commits_since(&ctx.root, SINCE) {
        Ok(commits) => commits,
        Err(problem) => return report.check("history", Outcome::Fail, &problem),
    };
    let long = long_subjects(&commits);
    long.iter().for_each(|line| println!("  {line}"));
    if long.is_empty() {
        let detail = format!("{} commits since {SINCE}, every subject within {MAX_SUBJECT}", commits.len());
        report.check("history", Outcome::Ok, &detail);
    } else {
        let detail = format!(
            "{} of {} subjects are longer than {MAX_SUBJECT} characters: shorten them (git rebase -i, \
             reword) and move the detail into the body",
            long.len(),
            commits.len()
        );
        report.check("history", Outcome::Fail, &detail);
    }
}
