//! The `figures` check passes only on a run
//! of `cargo run --example figures -- --check` that ends saying the figures
//! match, and fails naming each figure the run found changed, missing or
//! drawn by nothing, or pointing at the log when the run ended early. The
//! outputs below are what examples/figures.rs prints in each case.
//! Run: cargo test -p xtask --test figures_check

use xtask::figures_check::verdict;
use xtask::report::Outcome;

#[test]
fn a_run_whose_figures_all_match_passes() {
    let output = "1 figures match /repo/chapters/figures\n";
    assert_eq!(verdict(true, output), (Outcome::Ok, "1 figures match /repo/chapters/figures".to_string()));
}

#[test]
fn a_changed_figure_fails_the_check_naming_it_and_the_command_that_rewrites_it() {
    let output = "differs: /repo/chapters/figures/ch05-gpt-buckets.svg\n\
                  Error: 1 problems with 1 figures: run `cargo run --example figures` to rewrite them\n";
    let (outcome, detail) = verdict(false, output);
    assert_eq!(outcome, Outcome::Fail);
    assert!(detail.contains("differs: /repo/chapters/figures/ch05-gpt-buckets.svg"), "{detail}");
    assert!(detail.contains("cargo run --example figures"), "{detail}");
}

#[test]
fn a_missing_and_an_undrawn_figure_are_both_named() {
    let output =
        "missing: /repo/chapters/figures/a.svg\nnot drawn by any figure: /repo/chapters/figures/b.svg\n";
    let (outcome, detail) = verdict(false, output);
    assert_eq!(outcome, Outcome::Fail);
    assert!(detail.contains("missing: /repo/chapters/figures/a.svg"), "{detail}");
    assert!(detail.contains("not drawn by any figure: /repo/chapters/figures/b.svg"), "{detail}");
}

#[test]
fn a_run_that_did_not_get_to_compare_fails_pointing_at_the_log() {
    for (success, output) in [(false, "error[E0425]: cannot find value `x`\n"), (true, "")] {
        let (outcome, detail) = verdict(success, output);
        assert_eq!(outcome, Outcome::Fail, "{output:?}");
        assert!(detail.contains("target/test-logs/figures.log"), "{detail}");
    }
}

#[test]
fn a_run_that_lists_a_problem_fails_even_when_it_exits_zero() {
    let output = "differs: /repo/chapters/figures/x.svg\n1 figures match /repo/chapters/figures\n";
    assert_eq!(verdict(true, output).0, Outcome::Fail);
}
