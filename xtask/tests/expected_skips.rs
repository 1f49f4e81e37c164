//! The expected-skips list: what it allows, where, and what fails a run.

use xtask::expected_skips::{judge, load, parse, Machine, Skipped};
use xtask::repo_root;

const LIST: &str = r#"
tests = 10

[[skip]]
target = "nccl"
name = "*"
when = "no GPU"
reason = "needs a GPU"

[[skip]]
target = "dist"
name = "collectives::timing"
when = "always"
reason = "prints timings"

[[skip]]
target = "check"
name = "teeth chapter_*"
when = "outside CI"
reason = "an edited exercise"
"#;

fn skip(target: &str, name: &str) -> Skipped {
    Skipped { target: target.into(), name: name.into(), reason: "because".into() }
}

const NO_GPU_LAPTOP: Machine = Machine { gpu: false, ci: false };
const GPU_CI: Machine = Machine { gpu: true, ci: true };

#[test]
fn listed_skips_pass_where_their_entry_allows_them() {
    let list = parse(LIST).unwrap();
    let skips = [
        skip("nccl", "training::ddp_step"),
        skip("dist", "collectives::timing"),
        skip("check", "teeth chapter_04"),
    ];
    assert_eq!(judge(&list, 10, 3, &skips, NO_GPU_LAPTOP), Vec::<String>::new());
}

#[test]
fn a_skip_nobody_listed_fails_the_run_and_names_itself() {
    let list = parse(LIST).unwrap();
    let problems = judge(&list, 10, 1, &[skip("multinode", "training_on_two_nodes")], NO_GPU_LAPTOP);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("multinode training_on_two_nodes was skipped"), "{problems:?}");
}

#[test]
fn a_gpu_test_skipped_on_a_gpu_machine_fails() {
    let list = parse(LIST).unwrap();
    let problems = judge(&list, 10, 1, &[skip("nccl", "training::ddp_step")], GPU_CI);
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[test]
fn an_edited_chapter_may_skip_teeth_only_outside_ci() {
    let list = parse(LIST).unwrap();
    let skips = [skip("check", "teeth chapter_04")];
    assert!(judge(&list, 10, 1, &skips, NO_GPU_LAPTOP).is_empty());
    assert_eq!(judge(&list, 10, 1, &skips, Machine { gpu: false, ci: true }).len(), 1);
}

#[test]
fn an_exact_name_is_not_a_prefix() {
    let list = parse(LIST).unwrap();
    let problems = judge(&list, 10, 1, &[skip("dist", "collectives::timing_of_more")], NO_GPU_LAPTOP);
    assert_eq!(problems.len(), 1, "{problems:?}");
}

#[test]
fn fewer_tests_than_the_list_records_fail_and_more_pass() {
    let list = parse(LIST).unwrap();
    let problems = judge(&list, 9, 0, &[], NO_GPU_LAPTOP);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("1 fewer than the 10"), "{problems:?}");
    assert!(judge(&list, 11, 0, &[], NO_GPU_LAPTOP).is_empty());
}

#[test]
fn a_skip_without_a_name_cannot_be_judged_and_fails() {
    let list = parse(LIST).unwrap();
    let problems = judge(&list, 10, 2, &[skip("dist", "collectives::timing")], NO_GPU_LAPTOP);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("1 skipped without a name"), "{problems:?}");
}

#[test]
fn mistakes_in_the_file_are_named() {
    let no_count = parse("[[skip]]\ntarget='a'\nname='b'\nwhen='always'\nreason='c'\n").unwrap_err();
    assert!(no_count.contains("tests = N"), "{no_count}");
    let bad_when =
        parse("tests = 1\n[[skip]]\ntarget='a'\nname='b'\nwhen='sometimes'\nreason='c'\n").unwrap_err();
    assert!(bad_when.contains("when = \"sometimes\""), "{bad_when}");
    let no_reason =
        parse("tests = 1\n[[skip]]\ntarget='a'\nname='b'\nwhen='always'\nreason=' '\n").unwrap_err();
    assert!(no_reason.contains("gives no reason"), "{no_reason}");
}

/// The committed list names test files that exist, and each exact name is
/// a test function there: an entry cannot outlive its test unnoticed.
#[test]
fn the_committed_list_names_tests_that_exist() {
    let root = repo_root();
    let list = load(&root).unwrap();
    for entry in list.allowed.iter().filter(|entry| entry.target != "check") {
        let file = root.join("tests").join(format!("{}.rs", entry.target));
        assert!(file.is_file(), "{} names tests/{}.rs, which does not exist", entry.name, entry.target);
        if entry.name.ends_with('*') {
            continue;
        }
        let function = entry.name.rsplit("::").next().unwrap();
        let mut sources = vec![file];
        if let Ok(folder) = std::fs::read_dir(root.join("tests").join(&entry.target)) {
            sources.extend(folder.flatten().map(|item| item.path()));
        }
        let found = sources.iter().any(|path| {
            std::fs::read_to_string(path).is_ok_and(|text| text.contains(&format!("fn {function}(")))
        });
        assert!(
            found,
            "{FILE} allows {}::{}, and no such test function exists",
            entry.target,
            entry.name,
            FILE = "tests/expected_skips.toml"
        );
    }
}
