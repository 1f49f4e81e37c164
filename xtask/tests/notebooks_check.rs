//! The `notebooks` check fails when it
//! cannot count the notebooks: no notebook runner in the checkout, or a run
//! that ends without its `N passed, N failed` line. A stand-in `.venv/bin/python`
//! (a shell script) plays the notebook runner.
//! Run: cargo test -p xtask --test notebooks_check

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use xtask::report::Report;
use xtask::tool_checks::notebooks;
use xtask::Context;

/// A checkout whose notebook runner prints `run_output` and exits 0 (its
/// `--check-clean` and its own tests pass); `None`: no runner at all.
fn checkout(name: &str, run_output: Option<&str>) -> Context {
    let root = std::env::temp_dir().join(format!("xtask-notebooks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for folder in ["scripts", ".venv/bin", "logs"] {
        std::fs::create_dir_all(root.join(folder)).expect("a temporary folder");
    }
    if let Some(output) = run_output {
        std::fs::write(root.join("scripts/run_notebooks.py"), "# stand-in\n").expect("written");
        let python = format!(
            "#!/bin/sh\nif [ \"$1\" = scripts/run_notebooks.py ] && [ $# = 1 ]; then printf '{output}'; else echo ok; fi\n"
        );
        let path: PathBuf = root.join(".venv/bin/python");
        std::fs::write(&path, python).expect("written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("executable");
    }
    Context { log_dir: root.join("logs"), root, ci: false }
}

fn failed_checks(ctx: &Context) -> usize {
    let mut report = Report::new();
    notebooks(ctx, &mut report);
    let _ = std::fs::remove_dir_all(&ctx.root);
    report.failed()
}

#[test]
fn a_run_that_counts_its_notebooks_passes() {
    let ctx = checkout("counted", Some("01-collectives.ipynb ok\\n1 passed, 0 failed\\n"));
    assert_eq!(failed_checks(&ctx), 0);
}

#[test]
fn a_missing_notebook_runner_fails() {
    let ctx = checkout("no-runner", None);
    assert_eq!(failed_checks(&ctx), 1, "no scripts/run_notebooks.py must fail, not pass silently");
}

#[test]
fn a_run_without_its_summary_line_fails() {
    let ctx = checkout("no-summary", Some("01-collectives.ipynb ok\\n"));
    assert_eq!(failed_checks(&ctx), 1, "a run that never says how many notebooks passed proves nothing");
}

#[test]
fn a_run_of_no_notebook_fails() {
    let ctx = checkout("none-ran", Some("0 passed, 0 failed\\n"));
    assert_eq!(failed_checks(&ctx), 1, "no notebook ran: nothing was checked");
}
