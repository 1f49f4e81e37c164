//! The import-circle part of the `layering` check, on
//! this repository (no circle beyond the known list) and on small made-up
//! crates, each with one circle planted, or one arrangement that only looks
//! like a circle. Run: cargo test -p xtask --test layering_circles

mod common;

use std::path::PathBuf;

use xtask::layering_check::circles::{import_circles, import_circles_under, CirclesOutcome, KNOWN};

/// A repository holding `files` (path from the root, text).
fn repo(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::repo(&format!("circles-{name}"), files)
}

/// The check on a made-up repository, with `known` set apart.
fn check_with(name: &str, files: &[(&str, &str)], known: &[(&str, &str)]) -> CirclesOutcome {
    let root = repo(name, files);
    let outcome = import_circles_under(&root, &["src", "examples"], known);
    let _ = std::fs::remove_dir_all(root);
    outcome
}

/// What fails the check on a made-up repository.
fn problems(name: &str, files: &[(&str, &str)]) -> Vec<String> {
    check_with(name, files, &[]).problems
}

/// A library whose `ddp` module holds three files, `a`, `b` and `c`.
/// (The made-up trees reuse the repository's file names: the `files` check
/// reads this file too, and every path it names must exist.)
fn library<'a>(a: &'a str, b: &'a str, c: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("src/lib.rs", "pub mod ddp;\n"),
        ("src/ddp/mod.rs", "mod naive;\nmod sampler;\nmod seams;\n"),
        ("src/ddp/naive.rs", a),
        ("src/ddp/sampler.rs", b),
        ("src/ddp/seams.rs", c),
    ]
}

#[test]
fn this_repository_has_no_circle_beyond_the_known_ones() {
    let outcome = import_circles(&xtask::repo_root());
    assert!(outcome.crates > 10, "it read the library, the examples and xtask: {} crates", outcome.crates);
    assert!(outcome.files > 150, "it read their files: {}", outcome.files);
    assert_eq!(outcome.problems, Vec::<String>::new());
    assert_eq!(outcome.known.len(), KNOWN.len(), "every known circle is still there (else it is a problem)");
}

#[test]
fn two_sibling_files_using_each_other_are_a_circle_named_with_both_uses() {
    let found = problems(
        "pair",
        &library(
            "use super::sampler::Bee;\npub struct Ay;\n",
            "pub struct Bee;\n\nuse super::naive::Ay;\n",
            "",
        ),
    );
    assert_eq!(
        found,
        ["src/ddp/naive.rs <-> src/ddp/sampler.rs: naive.rs uses `Bee` (line 1) from sampler.rs; sampler.rs uses `Ay` \
          (line 3) from naive.rs; move the piece they share into a third file that imports neither"]
    );
}

#[test]
fn a_circle_through_grouped_renamed_and_crate_rooted_uses_is_found() {
    let a = "use super::{seams::Cee, sampler::{self, Bee as B}};\npub struct Ay;\n";
    let b = "use crate::ddp::{naive::{Ay}};\npub struct Bee;\n";
    let found = problems("group", &library(a, b, "pub struct Cee;\n"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/ddp/naive.rs <-> src/ddp/sampler.rs: naive.rs uses `Bee` (line 1)"),
        "{found:?}"
    );
}

#[test]
fn paths_in_code_and_in_macro_arguments_count_as_uses() {
    let a = "pub fn make() -> u8 { 1 }\nfn f() { let v = vec![super::sampler::twice()]; }\n";
    let b = "pub fn twice() -> u8 {\n    2 * crate::ddp::naive::make()\n}\n";
    let found = problems("code", &library(a, b, ""));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("naive.rs uses `twice` (line 2) from sampler.rs; sampler.rs uses `make` (line 2)"),
        "{found:?}"
    );
}

#[test]
fn a_circle_through_the_re_exports_of_mod_rs_names_the_files_that_define_the_items() {
    // Cousins: reducer/buckets.rs and wrapper/step.rs, each through the other's mod.rs.
    let files = [
        ("src/lib.rs", "pub mod ddp;\n"),
        ("src/ddp/mod.rs", "mod reducer;\nmod wrapper;\npub use reducer::Bucket;\npub use wrapper::Step;\n"),
        ("src/ddp/reducer/mod.rs", "mod buckets;\npub use buckets::Bucket;\n"),
        ("src/ddp/reducer/buckets.rs", "use crate::ddp::Step;\npub struct Bucket;\n"),
        ("src/ddp/wrapper/mod.rs", "mod step;\npub use self::step::*;\n"),
        ("src/ddp/wrapper/step.rs", "pub struct Step;\nfn f(b: crate::ddp::Bucket) {}\n"),
    ];
    let found = problems("re-exports", &files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "src/ddp/reducer/buckets.rs <-> src/ddp/wrapper/step.rs: reducer/buckets.rs uses `Step` (line 1) \
             from wrapper/step.rs; wrapper/step.rs uses `Bucket` (line 2)"
        ),
        "{found:?}"
    );
}

#[test]
fn a_parent_that_re_exports_its_children_is_no_circle() {
    // The child uses what the parent only re-exports from a third file:
    // that names the third file, not the parent.
    let files = [
        ("src/lib.rs", "pub mod ddp;\npub mod train;\n"),
        (
            "src/ddp/mod.rs",
            "mod replicated;\nmod sampler;\npub use replicated::Replicated;\npub use sampler::Sampler;\n\
             fn f() { replicated::make(); }\n",
        ),
        (
            "src/ddp/replicated.rs",
            "use super::Sampler;\nuse crate::ddp::sampler;\npub struct Replicated;\npub fn make() {}\n",
        ),
        ("src/ddp/sampler.rs", "pub struct Sampler;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"),
        ("src/train/mod.rs", "use crate::ddp::{Replicated, Sampler};\n"),
    ];
    assert_eq!(problems("re-export", &files), Vec::<String>::new());
}

#[test]
fn a_child_using_what_its_parent_defines_while_the_parent_uses_the_child_is_a_circle() {
    let files = [
        ("src/lib.rs", "pub mod train;\n"),
        ("src/train/mod.rs", "mod run;\npub use run::train_rank;\npub struct TrainConfig;\n"),
        ("src/train/run.rs", "use super::TrainConfig;\npub fn train_rank(_: &TrainConfig) {}\n"),
    ];
    let found = problems("parent", &files);
    assert_eq!(
        found,
        ["src/train/mod.rs <-> src/train/run.rs: mod.rs uses `train_rank` (line 2) from run.rs; run.rs uses \
          `TrainConfig` (line 1) from mod.rs; move what run.rs uses of mod.rs into a file of its own that both import"]
    );
}

#[test]
fn support_files_of_an_example_are_siblings_under_their_path_attributes() {
    let files = [
        (
            "examples/bench_sync.rs",
            "#[path = \"support/median.rs\"]\nmod median;\n#[path = \"support/machine.rs\"]\nmod machine;\n\
             fn main() {}\n",
        ),
        ("examples/support/median.rs", "pub fn median() {}\npub fn f(r: super::machine::Row) {}\n"),
        ("examples/support/machine.rs", "use crate::median::median;\npub struct Row;\n"),
    ];
    let found = problems("examples", &files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("examples/support/machine.rs <-> examples/support/median.rs:"), "{found:?}");
}

#[test]
fn a_ring_of_three_siblings_is_a_circle_too() {
    let a = "use super::sampler::Bee;\npub struct Ay;\n";
    let b = "use super::seams::Cee;\npub struct Bee;\n";
    let c = "use super::naive::Ay;\npub struct Cee;\n";
    let found = problems("ring", &library(a, b, c));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with(
            "src/ddp/naive.rs -> src/ddp/sampler.rs -> src/ddp/seams.rs -> src/ddp/naive.rs: naive.rs uses `Bee`"
        ),
        "{found:?}"
    );
    // One way only: no circle.
    assert_eq!(problems("chain", &library(a, b, "pub struct Cee;\n")), Vec::<String>::new());
}

#[test]
fn a_known_circle_is_set_apart_and_a_known_one_that_is_gone_fails() {
    let circle =
        library("use super::sampler::Bee;\npub struct Ay;\n", "use super::naive::Ay;\npub struct Bee;\n", "");
    let outcome = check_with("known", &circle, &[("src/ddp/naive.rs", "src/ddp/sampler.rs")]);
    assert_eq!(outcome.problems, Vec::<String>::new());
    assert_eq!(outcome.known.len(), 1);
    let untangled =
        library("use super::seams::Cee;\npub struct Ay;\n", "pub struct Bee;\n", "pub struct Cee;\n");
    let outcome = check_with("known-gone", &untangled, &[("src/ddp/naive.rs", "src/ddp/sampler.rs")]);
    assert_eq!(outcome.problems.len(), 1, "{:?}", outcome.problems);
    assert!(
        outcome.problems[0].contains("no longer a circle; delete it from KNOWN"),
        "{:?}",
        outcome.problems
    );
}

#[test]
fn a_file_syn_cannot_read_is_a_problem() {
    let found = problems("unreadable", &library("pub fn f( {}\n", "", ""));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("src/ddp/naive.rs: syn cannot read it (line 1,"), "{found:?}");
}
