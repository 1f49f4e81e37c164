//! The text-only parts of `cargo xtask waits`
//! (xtask/src/waits_log.rs): reading a log of `bash .ci/run`, removing the
//! inner loop's scratch line, cargo's and libtest's times, the table. Run: cargo test -p xtask --test waits

use xtask::waits_log::{
    cargo_build_seconds, largest_parts, markdown_table, parse_ci_log, test_run_seconds, without_scratch_edit,
    Part, Row, SCRATCH_MARK,
};

/// A shortened log of `bash .ci/run`, with the lines each part prints.
const CI_LOG: &str = "\
ddp-workbook set-up in /tmp/clone

==> [1/10] Rust toolchain
    ok: cargo 1.95.0
    [1/10] took 0s

==> [4/10] PyTorch 2.11.0 (libtorch) in .venv
    installing torch==2.11.0 into .venv
    [4/10] took 95s

==> [10/10] notebooks: evcxr_jupyter, Jupyter and the Rust kernel
    running scripts/setup_notebooks.sh

==> notebooks: evcxr_jupyter 0.22.0 (the Rust kernel)
    ok: evcxr_jupyter 0.22.0
    notebooks: took 1s

==> notebooks: the kernel's crate, prebuilt (a notebook's first cell then compiles none of it)
    ok: prebuilt in 88 s
    notebooks: took 90s
    [10/10] took 93s

Set-up complete in 190s (load average 2.1 1.5 1.0). Next: scripts/test.sh (or cargo test --test chapter_01).

==> cargo fmt --check
OK    fmt                   2s
==> cargo test --features solutions,mpi,nccl (all tests and doc tests, reference solutions)
        5 passed, 0 failed, 0 ignored
----  solutions           230s  275 passed, 0 failed, 8 skipped
==> teeth: on the untouched stubs
OK    teeth chapter_01     22s  9 tests reach the exercise
OK    teeth chapter_12     36s  4 tests reach the exercise
==> notebooks: run every notebook in a fresh Rust kernel
ok    00-introduction.ipynb           46.4 s  (8 code cells run)
----  notebooks           379s  13 passed, 0 failed (counted per notebook)
OK    notebooks-clean     379s  13 passed, 0 failed
OK    notebook-runner     399s  OK

cargo xtask test took 858s

398 passed, 0 failed, 8 skipped
";

fn part(name: &str, seconds: u64) -> Part {
    Part { name: name.to_string(), seconds }
}

#[test]
fn a_ci_log_gives_each_setup_step_and_each_check_its_seconds() {
    let log = parse_ci_log(CI_LOG);
    assert_eq!(log.setup_seconds, Some(190));
    assert_eq!(log.suite_seconds, Some(858));
    assert_eq!(
        log.setup_steps,
        vec![
            part("Rust toolchain", 0),
            part("PyTorch 2.11.0 (libtorch) in .venv", 95),
            part("notebooks: evcxr_jupyter 0.22.0 (the Rust kernel)", 1),
            part(
                "notebooks: the kernel's crate, prebuilt (a notebook's first cell then compiles none of it)",
                90
            ),
            // The step's own line comes after its sections', and counts under the step's title.
            part("notebooks: evcxr_jupyter, Jupyter and the Rust kernel", 93),
        ]
    );
    // A section lasts as long as its largest "seconds since it began"; a
    // check with several lines (teeth) counts once, at its largest.
    assert_eq!(
        log.suite_checks,
        vec![
            part("fmt", 2),
            part("solutions", 230),
            part("teeth", 36),
            part("notebooks", 379),
            part("notebooks-clean", 379),
            part("notebook-runner", 399),
        ]
    );
}

#[test]
fn a_log_without_step_times_still_gives_the_totals() {
    // Logs written before setup.sh printed its steps' times.
    let old = "==> [1/10] Rust toolchain\n    ok: cargo\nSet-up complete in 66s. Next: scripts/test.sh\n\
               ----  solutions           230s  275 passed\ncargo xtask test took 858s\n";
    let log = parse_ci_log(old);
    assert_eq!((log.setup_seconds, log.suite_seconds), (Some(66), Some(858)));
    assert!(log.setup_steps.is_empty());
    assert_eq!(largest_parts(&log.setup_steps, 3), "(the log holds no per-part times)");
    assert_eq!(log.suite_checks, vec![part("solutions", 230)]);
}

#[test]
fn the_largest_parts_come_first_and_zero_second_parts_are_left_out() {
    let parts = [part("fmt", 2), part("solutions", 230), part("files", 0), part("notebooks", 379)];
    assert_eq!(largest_parts(&parts, 2), "notebooks 379 s, solutions 230 s");
    assert_eq!(largest_parts(&parts, 9), "notebooks 379 s, solutions 230 s, fmt 2 s");
}

#[test]
fn the_scratch_line_is_removed_and_nothing_else() {
    let original = "pub fn f() {}\n// a comment that stays\n";
    assert_eq!(without_scratch_edit(original), None, "no scratch line: nothing to restore");
    let edited = format!("{original}{SCRATCH_MARK} (2)\n");
    assert_eq!(without_scratch_edit(&edited).as_deref(), Some(original));
    // Two lines left by two killed runs go too; the bytes around them stay.
    let twice = format!("pub fn f() {{}}\n{SCRATCH_MARK} (1)\n// a comment that stays\n{SCRATCH_MARK} (3)\n");
    assert_eq!(without_scratch_edit(&twice).as_deref(), Some(original));
}

#[test]
fn the_markdown_table_has_a_row_per_wait_and_escapes_pipes() {
    let rows = [Row {
        wait: "inner loop".into(),
        measured: "2.1 s".into(),
        target: "under 10 s".into(),
        made_of: "a | b".into(),
    }];
    let table = markdown_table(&rows);
    assert_eq!(
        table,
        "| wait | measured | target | what it is made of |\n| --- | --- | --- | --- |\n\
         | inner loop | 2.1 s | under 10 s | a \\| b |\n"
    );
}

#[test]
fn cargo_and_libtest_say_how_long_the_build_and_the_tests_took() {
    let finished = "    Finished `test` profile [unoptimized + debuginfo] target(s) in 1m 02s";
    assert_eq!(cargo_build_seconds(finished), Some(62.0));
    assert_eq!(
        cargo_build_seconds("    Finished `test` profile [unoptimized + debuginfo] target(s) in 3.45s"),
        Some(3.45)
    );
    assert_eq!(cargo_build_seconds("   Compiling ddp-workbook v0.1.0 (/work/main)"), None);
    let result =
        "test result: FAILED. 2 passed; 6 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.05s";
    assert_eq!(test_run_seconds(result), Some(0.05));
    assert_eq!(test_run_seconds("running 8 tests"), None);
}
