//! Unit tests of the reader of
//! `cargo test --no-run --message-format=json`. Run: cargo test -p xtask --test cargo_json

use std::path::PathBuf;

use xtask::cargo_json::{parse_cargo_line, BuildOutcome, CargoMessage, TestExecutable};

fn artifact(kind: &str, name: &str, test: bool, executable: Option<&str>) -> String {
    let executable = executable.map_or("null".to_string(), |path| format!("\"{path}\""));
    format!(
        r#"{{"reason":"compiler-artifact","package_id":"path+file:///r#ddp-workbook@0.1.0","manifest_path":"/r/Cargo.toml","target":{{"kind":["{kind}"],"crate_types":["{kind}"],"name":"{name}","src_path":"/r/x.rs","edition":"2021","doctest":false,"test":true}},"profile":{{"opt_level":"0","debuginfo":2,"debug_assertions":true,"overflow_checks":true,"test":{test}}},"features":["solutions"],"filenames":["/r/target/debug/deps/{name}-1"],"executable":{executable},"fresh":true}}"#
    )
}

#[test]
fn test_harnesses_are_found_and_other_artifacts_are_not() {
    let harness =
        parse_cargo_line(&artifact("test", "chapter_01", true, Some("/r/target/debug/deps/chapter_01-1")));
    let expected = TestExecutable {
        target_name: "chapter_01".into(),
        kind: "test".into(),
        path: PathBuf::from("/r/target/debug/deps/chapter_01-1"),
    };
    assert_eq!(harness, Some(CargoMessage::TestExecutable(expected)));
    // An example built only to check that it compiles, and a plain library.
    assert_eq!(
        parse_cargo_line(&artifact("example", "train", false, Some("/r/train"))),
        Some(CargoMessage::Other)
    );
    assert_eq!(parse_cargo_line(&artifact("lib", "ddp_workbook", false, None)), Some(CargoMessage::Other));
    assert_eq!(parse_cargo_line("   Compiling tch v0.24.0"), None);
}

#[test]
fn errors_are_kept_and_the_build_result_is_read() {
    let mut outcome = BuildOutcome::default();
    let error = r#"{"reason":"compiler-message","message":{"level":"error","rendered":"error[E0425]: cannot find value `x`\n"}}"#;
    let warning =
        r#"{"reason":"compiler-message","message":{"level":"warning","rendered":"warning: unused\n"}}"#;
    assert_eq!(outcome.record(error).as_deref(), Some("error[E0425]: cannot find value `x`\n"));
    assert_eq!(outcome.record(warning).as_deref(), Some("warning: unused\n"));
    assert_eq!(outcome.record(r#"{"reason":"build-finished","success":false}"#), None);
    assert_eq!(outcome.errors, ["error[E0425]: cannot find value `x`\n"]);
    assert_eq!(outcome.success, Some(false));
}

#[test]
fn executables_run_library_first_then_by_name() {
    let mut outcome = BuildOutcome::default();
    for (kind, name) in
        [("test", "models"), ("test", "chapter_02"), ("lib", "ddp_workbook"), ("test", "chapter_01")]
    {
        outcome.record(&artifact(kind, name, true, Some(&format!("/r/{name}"))));
    }
    let order: Vec<String> =
        outcome.executables_in_run_order().into_iter().map(|e| e.cargo_selector()).collect();
    assert_eq!(order, ["--lib", "--test chapter_01", "--test chapter_02", "--test models"]);
}
