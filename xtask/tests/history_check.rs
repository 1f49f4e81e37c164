//! The `history` check: which subjects it reports, counted in characters,
//! read from a real git repository made for the test.

use std::path::Path;
use std::process::Command;

use xtask::history_check::{commits_since, long_subjects, MAX_SUBJECT};

fn commit(subject: &str) -> (String, String) {
    ("abc1234".to_string(), subject.to_string())
}

#[test]
fn a_subject_of_72_characters_passes_and_one_of_73_is_reported() {
    let fits = "a".repeat(MAX_SUBJECT);
    let over = "b".repeat(MAX_SUBJECT + 1);
    let reported = long_subjects(&[commit(&fits), commit(&over)]);
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(
        reported[0].starts_with("abc1234: 73 characters") && reported[0].ends_with(&over),
        "{reported:?}"
    );
}

#[test]
fn characters_are_counted_not_bytes() {
    // 72 characters, 2 bytes each: a byte count would call it 144.
    let accented = "é".repeat(MAX_SUBJECT);
    assert!(long_subjects(&[commit(&accented)]).is_empty());
}

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[test]
fn only_the_commits_after_the_base_are_read() {
    let dir = std::env::temp_dir().join(format!("xtask-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    git(&dir, &["init", "-q"]);
    let long = "c".repeat(MAX_SUBJECT + 5);
    git(&dir, &["commit", "-q", "--allow-empty", "-m", &long]); // before the base: not read
    git(&dir, &["commit", "-q", "--allow-empty", "-m", "the base"]);
    let base = git(&dir, &["rev-parse", "--short", "HEAD"]);
    git(&dir, &["commit", "-q", "--allow-empty", "-m", "short", "-m", &long]); // a long body is fine
    git(&dir, &["commit", "-q", "--allow-empty", "-m", &long]);
    let commits = commits_since(&dir, &base).expect("the base is in the history");
    let subjects: Vec<&str> = commits.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(subjects, [long.as_str(), "short"], "newest first, the base and before left out");
    assert_eq!(long_subjects(&commits).len(), 1);
    let missing = commits_since(&dir, "0000000").expect_err("no such commit");
    assert!(missing.contains("git fetch --unshallow"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
