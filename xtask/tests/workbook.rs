//! The pieces of `cargo workbook`: reading the
//! hints, choosing the next one, naming a test as a claim, and finding the
//! chapters of this repository with their exercises and hints.
//! Run: cargo test -p xtask --test workbook

use xtask::libtest_json::SuiteTally;
use xtask::workbook::{self, hints, verdict};

const HINTS: &str = "<!-- a header comment -->

<!-- ANCHOR: plan-1 -->
**The idea.** Walk backwards.
<!-- ANCHOR_END: plan-1 -->

<!-- ANCHOR: plan-2 -->
**The API.**

- `Bucket::new`
<!-- ANCHOR_END: plan-2 -->

<!-- ANCHOR: sync-1 -->
Copy in, reduce, copy out.
<!-- ANCHOR_END: sync-1 -->
";

#[test]
fn hints_are_read_between_their_anchors_in_file_order() {
    let parsed = hints::parse(HINTS);
    let summary: Vec<(&str, usize)> = parsed.iter().map(|h| (h.function.as_str(), h.step)).collect();
    assert_eq!(summary, [("plan", 1), ("plan", 2), ("sync", 1)]);
    assert_eq!(parsed[1].text, "**The API.**\n\n- `Bucket::new`");
}

#[test]
fn the_next_hint_is_the_first_unseen_step_of_the_first_exercise_not_done() {
    let parsed = hints::parse(HINTS);
    let order = vec!["sync".to_string(), "plan".to_string()];
    let next = |seen_plan, seen_sync| {
        let seen = move |f: &str| if f == "plan" { seen_plan } else { seen_sync };
        hints::next(&parsed, &order, seen).map(|h| (h.function.clone(), h.step))
    };
    assert_eq!(next(0, 0), Some(("sync".into(), 1)), "the first exercise in the order first");
    assert_eq!(next(0, 1), Some(("plan".into(), 1)), "then the next exercise");
    assert_eq!(next(1, 1), Some(("plan".into(), 2)));
    assert_eq!(next(2, 1), None, "all seen");
}

#[test]
fn a_test_name_reads_as_the_claim_it_checks() {
    assert_eq!(verdict::claim("one_rank_is_exactly_one_process"), "one rank is exactly one process");
    assert_eq!(verdict::claim("sampler::every_epoch_is_new"), "every epoch is new (sampler)");
}

#[test]
fn this_repositorys_chapters_have_their_exercises_hints_and_pages() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let numbers: Vec<&str> = chapters.iter().map(|c| c.number.as_str()).collect();
    assert_eq!(numbers, ["01", "02", "03", "04", "05", "06", "07", "11", "12", "13", "14"]);
    let ch03 = workbook::find(&chapters, "3").expect("`3` names chapter 03");
    assert_eq!(ch03.exercises, ["sync_gradients"]);
    assert_eq!(ch03.title, "Averaging gradients");
    assert!(workbook::find(&chapters, "chapter_07").is_some() && workbook::find(&chapters, "9").is_none());
    let (count, problems) = hints::check_all(&root).expect("the hints are readable");
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(
        count,
        3 * chapters.iter().map(|c| c.exercises.len()).sum::<usize>(),
        "three hints per exercise"
    );
}

#[test]
fn a_verdict_names_unwritten_exercises_once_instead_of_every_failure() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let ch03 = workbook::find(&chapters, "03").expect("chapter 03");
    let mut tally = SuiteTally::default();
    for line in [
        r#"{ "type": "test", "event": "ok", "name": "negative_control" }"#,
        r#"{ "type": "test", "event": "failed", "name": "one_rank", "stdout": "not yet implemented: exercise ch03: sync_gradients in src/ch03_averaging/exercise.rs" }"#,
    ] {
        tally.record_line(line);
    }
    let lines = verdict::describe(ch03, &tally, 1);
    assert!(lines[0].ends_with("1 of 2 claims hold"), "{lines:?}");
    assert!(lines.iter().any(|l| l.starts_with("not written yet: sync_gradients")), "{lines:?}");
}

/// A repository with one chapter, 01, whose exercise has `plan`, `sync`
/// and `gather`, with `hints` as its hints.md; its page shows every hint.
fn chapter_with_hints(name: &str, hints: &str) -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-hints-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // Joined a folder at a time: the `files` check reads whole paths in
    // this file as mentions of the repository's own files.
    let chapter = root.join("src").join("ch01_ring");
    std::fs::create_dir_all(&chapter).expect("a temporary folder");
    std::fs::create_dir_all(root.join("chapters")).expect("a temporary folder");
    let stubs = ["plan", "sync", "gather"]
        .map(|f| format!("pub fn {f}() {{\n    todo!(\"exercise ch01: {f} in here\")\n}}\n"));
    std::fs::write(chapter.join("exercise.rs"), stubs.concat()).expect("written");
    std::fs::write(chapter.join("hints.md"), hints).expect("written");
    let page: String = hints::parse(hints)
        .iter()
        .map(|h| format!("{{{{#include ../src/ch01_ring/hints.md:{}-{}}}}}\n", h.function, h.step))
        .collect();
    std::fs::write(root.join("chapters").join("01-ring.md"), format!("# Ring\n{page}")).expect("written");
    let answer = "# Chapter 1's reference solution\n{{#include ../src/ch01_ring/solution.rs:plan}}\n";
    std::fs::write(root.join("chapters").join("01-ring-solution.md"), answer).expect("written");
    root
}

fn hint(function: &str, step: usize, text: &str) -> String {
    format!("<!-- ANCHOR: {function}-{step} -->\n{text}\n<!-- ANCHOR_END: {function}-{step} -->\n")
}

#[test]
fn every_exercise_needs_exactly_three_hints_with_text() {
    let three = |f: &str| (1..=3).map(|step| hint(f, step, "Some text.")).collect::<String>();
    let good = format!("{}{}{}", three("plan"), three("sync"), three("gather"));
    let root = chapter_with_hints("good", &good);
    assert_eq!(hints::check_all(&root).expect("readable"), (9, vec![]));

    // plan: only two; sync: hint 2 is empty; gather: a fourth.
    let bad = format!(
        "{}{}{}{}{}{}",
        hint("plan", 1, "The idea."),
        hint("plan", 2, "The API."),
        hint("sync", 1, "The idea."),
        hint("sync", 2, "  "),
        hint("sync", 3, "Near-code."),
        three("gather") + &hint("gather", 4, "One more.")
    );
    let root = chapter_with_hints("bad", &bad);
    let (_, problems) = hints::check_all(&root).expect("readable");
    let _ = std::fs::remove_dir_all(&root);
    let named: Vec<&str> = problems.iter().filter_map(|p| p.split('`').nth(1)).collect();
    assert_eq!(named, ["plan", "sync", "gather"], "{problems:#?}");
}

#[test]
fn a_chapter_page_that_shows_the_answer_fails_the_hints_check() {
    let three = |f: &str| (1..=3).map(|step| hint(f, step, "Some text.")).collect::<String>();
    let hints_text = format!("{}{}{}", three("plan"), three("sync"), three("gather"));
    let root = chapter_with_hints("spoilers", &hints_text);
    let page = root.join("chapters").join("01-ring.md");
    let shown = std::fs::read_to_string(&page).expect("readable");
    // The solution page is not the chapter's page: its answer is no problem.
    assert_eq!(hints::check_all(&root).expect("readable"), (9, vec![]));
    for (spoiler, line) in [
        ("{{#include ../src/ch01_ring/solution.rs:sync}}", "solution.rs"),
        ("{{#include ../src/ddp/ring.rs:gather}}", "ring.rs:gather"),
    ] {
        std::fs::write(&page, format!("{shown}{spoiler}\n")).expect("written");
        let (_, problems) = hints::check_all(&root).expect("readable");
        assert_eq!(problems.len(), 1, "{spoiler}: {problems:#?}");
        assert!(problems[0].contains("shows the answer") && problems[0].contains(line), "{problems:#?}");
    }
    // The stub's own anchors are not an answer.
    std::fs::write(&page, format!("{shown}{{{{#include ../src/ch01_ring/exercise.rs:plan}}}}\n"))
        .expect("written");
    assert_eq!(hints::check_all(&root).expect("readable").1, Vec::<String>::new());
    std::fs::remove_file(root.join("chapters").join("01-ring-solution.md")).expect("removed");
    let (_, problems) = hints::check_all(&root).expect("readable");
    let _ = std::fs::remove_dir_all(&root);
    assert!(problems.len() == 1 && problems[0].contains("no reference solution page"), "{problems:#?}");
}

#[test]
fn the_solution_is_offered_only_once_every_claim_holds() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let ch03 = workbook::find(&chapters, "03").expect("chapter 03");
    let page = workbook::solution_page(&root, "03").expect("chapter 03 has a solution page");
    assert!(page.ends_with("03-averaging-solution.md"), "{}", page.display());
    assert!(workbook::chapter_page(&root, "03").expect("a page").ends_with("03-averaging.md"));
    let run = |lines: &[&str]| {
        let mut tally = SuiteTally::default();
        lines.iter().for_each(|line| tally.record_line(line));
        (verdict::chapter_passes(&tally), verdict::next_step(ch03, &tally, Some("SOLUTION_PAGE")).join("\n"))
    };
    let control = r#"{ "type": "test", "event": "ok", "name": "controls::a_control" }"#;
    let claim = r#"{ "type": "test", "event": "ok", "name": "one_rank" }"#;
    let failed = r#"{ "type": "test", "event": "failed", "name": "two_ranks", "stdout": "off by 1e-3" }"#;
    let started = r#"{ "type": "test", "event": "started", "name": "three_ranks" }"#;
    let done = r#"{ "type": "suite", "event": "ok", "passed": 2, "failed": 0, "ignored": 0 }"#;
    let not_yet = [
        (vec![control, claim, failed, done], "a failing claim"),
        (vec![control, done], "only the controls ran"),
        (vec![control, claim, started], "a crash cut the run short"),
    ];
    for (lines, case) in not_yet {
        let (passes, said) = run(&lines);
        assert!(!passes && !said.contains("SOLUTION_PAGE") && !said.contains("solution"), "{case}: {said}");
        assert!(said.contains("cargo workbook hint 03"), "{case}: {said}");
    }
    let (passes, said) = run(&[control, claim, done]);
    assert!(passes, "{said}");
    assert!(said.contains("Compare with the reference solution") && said.contains("SOLUTION_PAGE"), "{said}");
    assert!(said.contains("src/ch03_averaging/solution.rs"), "{said}");
}

#[test]
fn controls_pass_on_the_stubs_and_are_not_counted_as_claims_about_your_code() {
    let root = xtask::repo_root();
    let chapters = workbook::chapters(&root).expect("the chapters are readable");
    let ch01 = workbook::find(&chapters, "01").expect("chapter 01");
    let mut tally = SuiteTally::default();
    for line in [
        r#"{ "type": "test", "event": "ok", "name": "controls::a_fake_all_reduce_is_caught" }"#,
        r#"{ "type": "test", "event": "failed", "name": "ring_sums", "stdout": "not yet implemented: exercise ch01: ring_reduce_scatter in here" }"#,
    ] {
        tally.record_line(line);
    }
    assert_eq!(verdict::claims_holding(&tally), (0, 1));
    let lines = verdict::describe(ch01, &tally, 1);
    assert!(lines[0].ends_with("0 of 1 claims hold"), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("1 control passes too")), "{lines:?}");
}

#[test]
fn an_exercise_is_unwritten_while_its_todo_stays_and_a_file_mid_edit_still_lists_its_chapter() {
    let root = std::env::temp_dir().join(format!("xtask-workbook-edits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let chapter = root.join("src").join("ch01_ring");
    std::fs::create_dir_all(&chapter).expect("a temporary folder");
    let solution = "pub fn plan() {}\npub use crate::ddp::{sync, Bucket};\n";
    std::fs::write(chapter.join("solution.rs"), solution).expect("written");
    let chapter_now = |exercise: &str| {
        std::fs::write(chapter.join("exercise.rs"), exercise).expect("written");
        workbook::chapters(&root).expect("readable").remove(0)
    };
    // `plan` written; `sync` started, its todo! still below the new code.
    let started = chapter_now(
        "pub fn plan() {}\n// todo!(\"exercise ch01: plan\") in a comment is no todo\n\
         pub fn sync() {\n    let _x = 1;\n    todo!(\"exercise ch01: sync in here\")\n}\n",
    );
    assert_eq!(started.exercises, ["plan", "sync"]);
    assert_eq!(started.unwritten, ["sync"], "a todo! in a comment is no todo!");
    assert!(!started.untouched());
    // Half a line typed: the file does not parse, the chapter is still there, as started.
    let mid_edit = chapter_now(
        "pub fn plan() {\n    let x = \n}\npub fn sync() {\n    todo!(\"exercise ch01: sync\")\n}\n",
    );
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(mid_edit.exercises, ["plan", "sync"], "the solution's functions");
    assert!(mid_edit.unwritten.is_empty() && !mid_edit.untouched());
}

#[test]
fn the_workbook_command_line_says_what_is_wrong_and_exits_2() {
    let workbook = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_workbook"))
            .args(args)
            .output()
            .expect("cargo workbook starts");
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    for (args, says) in [
        (&["test"][..], "<NN>"),
        (&["test", "03", "0"], "invalid value '0'"),
        (&["hint", "03", "sync_gradients", "two"], "invalid value 'two'"),
        (&["tset", "03"], "unrecognized subcommand 'tset'"),
    ] {
        let (status, stderr) = workbook(args);
        assert_eq!(status, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?} should say {says:?}: {stderr}");
    }
    let (status, stderr) = workbook(&["hint", "9"]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("there is no chapter \"9\" with an exercise; the chapters are 01, "), "{stderr}");
}
