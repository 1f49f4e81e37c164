//! The `layering` check on this repository
//! (it must pass) and on small made-up trees with one violation planted in
//! each (it must name the file, the line and the module).
//! Run: cargo test -p xtask --test layering_check

mod common;

use std::path::PathBuf;

use xtask::layering_check::{check_layering, module_path, named_modules, violations_in};
use xtask::seams_check::SEAM_DOORS;

/// A repository holding `files` (path from the root, text).
fn repo(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::repo(&format!("layering-{name}"), files)
}

/// The violations of a made-up tree whose other files all keep the layers.
fn planted(name: &str, path: &str, text: &str) -> Vec<String> {
    let keeps = [
        ("src/ddp/mod.rs", "use crate::dist::Group;\nuse super::models::Mlp;\n"),
        ("src/ch05_bucketing/mod.rs", "pub use crate::ddp::{Bucket, GradientBuckets};\n"),
        ("examples/bench_sync.rs", "use ddp_workbook::ddp::naive;\nuse crate::machine::load;\n"),
    ];
    let mut files: Vec<(&str, &str)> = keeps.iter().filter(|(p, _)| *p != path).copied().collect();
    files.push((path, text));
    let root = repo(name, &files);
    let outcome = check_layering(&root);
    let _ = std::fs::remove_dir_all(root);
    outcome.violations
}

#[test]
fn this_repository_keeps_its_layers() {
    let outcome = check_layering(&xtask::repo_root());
    assert!(outcome.files_scanned > 50, "it read the crate: {} files", outcome.files_scanned);
    assert_eq!(outcome.violations, Vec::<String>::new());
}

#[test]
fn a_tree_that_keeps_its_layers_passes() {
    assert_eq!(planted("clean", "src/ddp/naive.rs", "use super::wrapper::Ddp;\n"), Vec::<String>::new());
}

#[test]
fn an_example_that_imports_a_chapter_fails_naming_the_line_and_the_chapter() {
    let violations = planted(
        "example",
        "examples/bench_sync.rs",
        "use ddp_workbook::ddp;\nuse ddp_workbook::ch06_overlap::solution;\n",
    );
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].starts_with("examples/bench_sync.rs:2: names `ch06_overlap`"), "{violations:?}");
}

#[test]
fn a_chapter_in_a_group_of_the_library_fails() {
    let violations =
        planted("group", "src/ddp/replicated.rs", "use crate::{dist::Group, ch05_bucketing::learner};\n");
    assert!(violations.len() == 1 && violations[0].contains("`ch05_bucketing`"), "{violations:?}");
}

#[test]
fn super_paths_are_resolved_from_the_files_own_module() {
    // From src/ddp/naive.rs, `super::` is src/ddp/ and `super::super::` the crate.
    assert_eq!(
        planted("super-inside", "src/ddp/naive.rs", "use super::train::Loop;\n"),
        Vec::<String>::new()
    );
    let violations = planted("super-out", "src/ddp/naive.rs", "use super::super::train::AdamW;\n");
    assert!(violations.len() == 1 && violations[0].contains("`train`"), "{violations:?}");
    // From src/ddp/mod.rs one `super::` is the crate already.
    let violations = planted("super-mod", "src/ddp/mod.rs", "use super::ch07_sharding::rows;\n");
    assert!(violations.len() == 1 && violations[0].contains("`ch07_sharding`"), "{violations:?}");
}

#[test]
fn the_process_groups_and_the_bottom_layer_use_nothing_above_them() {
    let violations = planted("dist", "src/dist/local/world.rs", "use crate::ddp::Bucket;\n");
    assert!(
        violations.len() == 1 && violations[0].contains("src/dist/ knows nothing of DDP"),
        "{violations:?}"
    );
    let violations = planted("autograd", "src/autograd/mod.rs", "let m = crate::dist::cause_in_words(&m);\n");
    assert!(violations.len() == 1 && violations[0].contains("the bottom layer"), "{violations:?}");
}

#[test]
fn a_chapter_may_use_the_library_and_itself_but_no_other_chapter() {
    let ok = "use crate::ddp::Replicated;\nuse crate::ch03_averaging::learner;\nuse super::learner::f;\n";
    assert_eq!(planted("chapter-ok", "src/ch03_averaging/mod.rs", ok), Vec::<String>::new());
    let violations = planted("chapter", "src/ch03_averaging/mod.rs", "use crate::ch02_replicas::verify;\n");
    assert!(
        violations.len() == 1 && violations[0].contains("never another chapter's files"),
        "{violations:?}"
    );
}

#[test]
fn doc_examples_and_path_attributes_count_and_plain_comments_do_not() {
    let text = "// Unlike ddp_workbook::ch06_overlap::solution, this copies nothing.\n\
                /// ```\n/// use ddp_workbook::ch01_collectives::learner;\n/// ```\n";
    let violations = planted("comments", "src/ddp/sampler.rs", text);
    assert!(violations.len() == 1 && violations[0].starts_with("src/ddp/sampler.rs:3:"), "{violations:?}");
    let violations = planted(
        "path",
        "examples/bench_sync.rs",
        "#[path = \"../src/ch06_overlap/solution.rs\"]\nmod solution;\n",
    );
    assert!(violations.len() == 1 && violations[0].contains("`ch06_overlap`"), "{violations:?}");
}

#[test]
fn module_paths_and_the_modules_a_line_names() {
    assert_eq!(module_path("src/dist/local/mod.rs"), ["dist", "local"]);
    assert_eq!(module_path("src/ddp/reducer/buckets.rs"), ["ddp", "reducer", "buckets"]);
    assert_eq!(module_path("examples/train.rs"), Vec::<String>::new());
    let own = module_path("src/train/run.rs");
    let named = named_modules(&own, true, "use crate::{ddp::{rows, train_step}, dist::Group, tch};")
        .expect("it lexes");
    assert_eq!(named, [(1, "ddp".to_string()), (1, "dist".to_string())]);
    // In an example, `crate::` is the example's own crate.
    assert_eq!(
        violations_in("examples/train.rs", "use crate::ch01_collectives::ring;"),
        Vec::<String>::new()
    );
}

#[test]
fn the_seams_are_fenced_off_outside_the_chapters() {
    // The library, the training run, an example and a library test, each by path or by a door.
    let planted_seams = [
        ("src/ddp/replicated.rs", "use super::seams::LocalBackward;\n", "ddp::seams"),
        ("src/train/run.rs", "use crate::ddp::seams::LocalBackward;\n", "ddp::seams"),
        (
            "examples/train.rs",
            "use ddp_workbook::ddp;\nfn f() { ddp.backward_local(&loss)?; }\n",
            "`backward_local`",
        ),
        ("tests/overlap.rs", "use ddp_workbook::ddp::{seams::OverlapSteps, Bucket};\n", "ddp::seams"),
        ("tests/ddp.rs", "let b = GradientBuckets::plan_with(pg, &params, caps, plan)?;\n", "`plan_with`"),
        (
            "tests/zero2.rs",
            "let z = ShardGradOp::with_steps(m, &vs, pg, caps, lr, wd, s)?;\n",
            "`with_steps`",
        ),
        (
            "tests/fsdp.rs",
            "let f = FullyShard::gpt_with_schedule(&gpt, &vs, pg, o, s)?;\n",
            "`gpt_with_schedule`",
        ),
        (
            "examples/memory_per_rank.rs",
            "fn f() { FullyShard::mlp_with_schedule(&m, &vs, pg, o, true, s)?; }\n",
            "`mlp_with_schedule`",
        ),
    ];
    for (path, text, named) in planted_seams {
        let violations = planted("seams", path, text);
        let line = text.lines().count();
        assert_eq!(violations.len(), 1, "{path}: {violations:?}");
        assert!(violations[0].starts_with(&format!("{path}:{line}: uses ")), "{violations:?}");
        assert!(violations[0].contains(named), "{path} should name {named}: {violations:?}");
    }
}

#[test]
fn the_chapters_and_their_tests_may_use_the_seams_and_prose_may_name_them() {
    let allowed = [
        ("src/ch06_overlap/mod.rs", "pub use crate::ddp::seams::{LocalBackward, OverlapSteps};\n"),
        ("tests/chapter_05/training.rs", "ddp.backward_local(&mse(&ddp.forward(&x), &y))?;\n"),
        (
            "tests/chapter_02.rs",
            "let r = Replicated::with_replica_check(m, &vs, pg, learner::verify_replicas)?;\n",
        ),
        (
            "src/ddp/replicated.rs",
            "/// chapter 2's through `ddp::seams` (`with_replica_check`)\nfn sync_without_copy_back() {}\n",
        ),
    ];
    for (path, text) in allowed {
        assert_eq!(planted("seams-ok", path, text), Vec::<String>::new(), "{path}");
    }
}

#[test]
fn the_ring_figure_may_name_chapter_1_only_through_its_solution() {
    let through_solution =
        "use ddp_workbook::ch01_collectives::solution::{ring_all_gather, ring_reduce_scatter};\n";
    assert!(violations_in("examples/figures/ch01_ring.rs", through_solution).is_empty());
    let learner = "use ddp_workbook::ch01_collectives::learner;\n";
    let found = violations_in("examples/figures/ch01_ring.rs", learner);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("other than as `ch01_collectives::solution`"), "{found:?}");
    // The exception is for that file and that chapter only.
    assert_eq!(violations_in("examples/figures/ch05_buckets.rs", through_solution).len(), 1);
    let other_chapter = "use ddp_workbook::ch05_bucketing::solution;\n";
    assert_eq!(violations_in("examples/figures/ch01_ring.rs", other_chapter).len(), 1);
}

#[test]
fn a_path_wrapped_over_several_lines_counts_and_strings_and_block_comments_do_not() {
    // rustfmt wraps a long use group one item a line.
    let wrapped = "use crate::{\n    dist::Group,\n    ch05_bucketing::learner,\n};\n";
    let violations = planted("wrapped", "src/ddp/replicated.rs", wrapped);
    assert!(
        violations.len() == 1 && violations[0].starts_with("src/ddp/replicated.rs:3: names `ch05_bucketing`"),
        "{violations:?}"
    );
    let prose = "let s = \"crate::ch05_bucketing::x\";\n/* crate::ch05_bucketing */\nconst R: &str = r#\"ddp_workbook::ch01_collectives\"#;\n";
    assert_eq!(planted("strings", "src/ddp/replicated.rs", prose), Vec::<String>::new());
    let macro_call = "fn f() {\n    let v = vec![crate::ch05_bucketing::plan()];\n}\n";
    let violations = planted("macro", "src/ddp/replicated.rs", macro_call);
    assert!(violations.len() == 1 && violations[0].starts_with("src/ddp/replicated.rs:2:"), "{violations:?}");
}

#[test]
fn a_doc_example_counts_with_its_hidden_lines_and_a_text_block_does_not() {
    let text = "/// Plans.\n///\n/// ```no_run\n/// # use ddp_workbook::ch05_bucketing::learner;\n/// ```\n///\n/// ```text\n/// ddp_workbook::ch06_overlap\n/// ```\npub fn plan() {}\n";
    let violations = planted("doc-hidden", "src/ddp/replicated.rs", text);
    assert!(
        violations.len() == 1 && violations[0].starts_with("src/ddp/replicated.rs:4: names `ch05_bucketing`"),
        "{violations:?}"
    );
}

#[test]
fn a_seam_in_a_wrapped_group_or_a_call_on_the_next_line_is_found() {
    let wrapped = "use crate::ddp::{\n    Bucket,\n    seams::LocalBackward,\n};\n";
    let violations = planted("seams-wrapped", "src/train/run.rs", wrapped);
    assert!(
        violations.len() == 1 && violations[0].starts_with("src/train/run.rs:3: uses ddp::seams"),
        "{violations:?}"
    );
    let chained = "fn f() {\n    ddp\n        .backward_local(&loss)?;\n}\n";
    let violations = planted("seams-chained", "src/train/run.rs", chained);
    assert!(
        violations.len() == 1
            && violations[0].starts_with("src/train/run.rs:3: uses ddp::seams' `backward_local`"),
        "{violations:?}"
    );
    let example = "/// Like so:\n///\n/// ```\n/// ddp.backward_local(&loss)?;\n/// ```\npub fn f() {}\n";
    let violations = planted("seams-doc-example", "src/ddp/replicated.rs", example);
    assert!(
        violations.len() == 1
            && violations[0].starts_with("src/ddp/replicated.rs:4: uses ddp::seams' `backward_local`"),
        "{violations:?}"
    );
    let prose = "// ddp.backward_local(&loss) would skip the sync\nconst WHY: &str = \"not ddp::seams\";\n";
    assert_eq!(planted("seams-prose", "src/train/run.rs", prose), Vec::<String>::new());
}

#[test]
fn a_file_that_does_not_lex_is_a_problem_said_once() {
    let violations = planted("unlexable", "src/ddp/replicated.rs", "fn f() { let s = \"unterminated; }\n");
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with("src/ddp/replicated.rs: cannot be read as Rust tokens (line 1,"),
        "{violations:?}"
    );
}

#[test]
fn every_door_declared_in_the_seams_module_is_fenced() {
    // The doors are the methods of the traits in src/ddp/seams.rs, read here
    // from the file itself, so a chapter's new door cannot be left unfenced.
    let seams = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/ddp/seams.rs");
    let text =
        std::fs::read_to_string(&seams).unwrap_or_else(|e| panic!("cannot read {}: {e}", seams.display()));
    let mut declared = Vec::new();
    let mut in_trait = false;
    for line in text.lines() {
        if line.starts_with("pub trait ") {
            in_trait = true;
        } else if line.starts_with('}') {
            in_trait = false;
        } else if let Some(rest) = line.trim_start().strip_prefix("fn ").filter(|_| in_trait) {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            declared.push(name);
        }
    }
    assert!(declared.len() >= 8, "too few doors read from {}: {declared:?}", seams.display());
    let unfenced: Vec<&String> = declared.iter().filter(|d| !SEAM_DOORS.contains(&d.as_str())).collect();
    assert!(unfenced.is_empty(), "doors of ddp::seams missing from SEAM_DOORS (add them): {unfenced:?}");
}
