//! Malformed calls fail at once with a clear `Invalid` error (and leave the
//! group usable), and `DDP_TIMEOUT_SECS` is read strictly.
//! Run: `cargo test --test dist invalid`

use std::process::Command;
use std::time::Duration;

use ddp_workbook::dist::{
    parse_timeout_secs, spawn, spawn_with, DistError, ReduceOp, SpawnError, SpawnOptions, DEFAULT_TIMEOUT,
};
use ddp_workbook::tch::{Device, Kind, Tensor};

use super::run_ok;

#[test]
fn invalid_arguments_fail_locally_with_a_clear_message() {
    let results = run_ok(2, |pg| {
        let me = pg.rank();
        let f32s = |shape: &[i64]| Tensor::ones(shape, (Kind::Float, Device::Cpu));
        let i64s = Tensor::ones([2], (Kind::Int64, Device::Cpu));
        let attempts: Vec<(&str, Result<(), DistError>)> = vec![
            ("not a rank", pg.broadcast(&mut f32s(&[2]), 2)),
            ("itself", pg.send(&f32s(&[2]), me)),
            ("not a rank", pg.send(&f32s(&[2]), 5)),
            ("itself", pg.recv(&mut f32s(&[2]), me)),
            ("not a rank", pg.recv(&mut f32s(&[2]), 7)),
            ("equal chunks", pg.reduce_scatter(&f32s(&[3, 2]), ReduceOp::Sum).map(drop)),
            ("equal chunks", pg.reduce_scatter(&Tensor::from(1.0f32), ReduceOp::Sum).map(drop)),
            ("floating-point", pg.all_reduce(&mut i64s.copy(), ReduceOp::Avg)),
            ("floating-point", pg.reduce_scatter(&i64s, ReduceOp::Avg).map(drop)),
            ("undefined", pg.all_reduce(&mut Tensor::new(), ReduceOp::Sum)),
            ("undefined", pg.broadcast(&mut Tensor::new(), 0)),
            ("undefined", pg.all_gather(&Tensor::new()).map(drop)),
            ("undefined", pg.send(&Tensor::new(), 1 - me)),
        ];
        let outcomes: Vec<(String, String)> = attempts
            .into_iter()
            .map(|(want, result)| {
                (
                    want.to_string(),
                    format!(
                        "{:?} / {}",
                        result,
                        result.as_ref().map_or_else(|e| e.to_string(), |_| String::new())
                    ),
                )
            })
            .collect();
        // None of the bad calls joined a collective, so the ranks are still in step.
        let mut t = f32s(&[2]);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        anyhow::ensure!(t.double_value(&[0]) == 2.0, "the group is out of step after invalid calls: {t}");
        Ok(outcomes)
    });
    for (rank, outcomes) in results.iter().enumerate() {
        for (want, got) in outcomes {
            assert!(
                got.starts_with("Err(Invalid {"),
                "rank {rank}: expected an Invalid error about {want:?}, got {got}"
            );
            assert!(got.contains(want), "rank {rank}: the message should say {want:?}: {got}");
        }
    }
}

#[test]
fn world_size_zero_is_refused_without_running_anything() {
    let ran = std::sync::atomic::AtomicBool::new(false);
    let run = |_pg| {
        ran.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    };
    assert!(matches!(spawn(0, run), Err(SpawnError::NoRanks(0))));
    let error = spawn_with(SpawnOptions::new(0).timeout(Duration::from_secs(1)), run).unwrap_err();
    assert!(error.to_string().contains("at least one rank"), "{error}");
    assert!(!ran.into_inner(), "no rank may run");
}

#[test]
fn timeout_seconds_parse_strictly() {
    assert_eq!(parse_timeout_secs("120"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_timeout_secs(" 0.25\n"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_timeout_secs("1e3"), Ok(Duration::from_secs(1000)));
    for bad in ["", "abc", "5m", "0", "-3", "inf", "NaN", "1e300"] {
        let problem = parse_timeout_secs(bad).expect_err(bad);
        assert!(problem.contains("second"), "{bad:?}: {problem}");
    }
}

/// Runs the ignored test `spawn_options_probe` in a child process with
/// `DDP_TIMEOUT_SECS` set, so that no thread of this process ever sees the
/// variable change (tests run in parallel, and the environment is shared).
fn probe(value: Option<&str>, expect: &str) -> std::process::Output {
    let mut child = Command::new(std::env::current_exe().expect("the test binary knows its path"));
    child.args(["--exact", "invalid::spawn_options_probe", "--ignored", "--nocapture", "--test-threads=1"]);
    child.env("DDP_PROBE_EXPECT", expect).env_remove("DDP_TIMEOUT_SECS");
    if let Some(value) = value {
        child.env("DDP_TIMEOUT_SECS", value);
    }
    child.output().expect("the test binary runs again as a child")
}

#[test]
fn spawn_options_read_ddp_timeout_secs() {
    for (value, expect) in
        [(None, "60000"), (Some(""), "60000"), (Some("2.5"), "2500"), (Some(" 90 "), "90000")]
    {
        let output = probe(value, expect);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "DDP_TIMEOUT_SECS={value:?}:\n{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("1 passed"), "the probe did not run:\n{stdout}");
    }
    assert_eq!(DEFAULT_TIMEOUT, Duration::from_secs(60), "the probes above assume the 60 s default");
    let output = probe(Some("5m"), "refused");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
}

/// Not a test on its own: `spawn_options_read_ddp_timeout_secs` runs it in a
/// child process. `DDP_PROBE_EXPECT` holds the timeout it must find, in
/// milliseconds, or `refused` if the value must be refused with an error.
#[test]
#[ignore = "run by spawn_options_read_ddp_timeout_secs in a child process"]
fn spawn_options_probe() {
    let Ok(expect) = std::env::var("DDP_PROBE_EXPECT") else {
        return println!("nothing to check: spawn_options_read_ddp_timeout_secs runs this probe");
    };
    if expect == "refused" {
        // An error from spawn, before any rank runs: no panic, no default.
        let error = spawn(2, |_pg| -> anyhow::Result<()> { panic!("no rank may run") })
            .expect_err("a bad value must be refused");
        let message = error.to_string();
        assert!(matches!(error, SpawnError::InvalidTimeout(_)), "{message}");
        assert!(message.contains("DDP_TIMEOUT_SECS") && message.contains("unset"), "{message}");
    } else {
        let options = SpawnOptions::new(2);
        let timeout = options.resolved_timeout().expect("a good value");
        assert_eq!((options.world_size, timeout.as_millis().to_string()), (2, expect));
    }
}

#[test]
fn a_zero_timeout_is_refused_like_the_variable_refuses_it() {
    let error = spawn_with(SpawnOptions::new(2).timeout(Duration::ZERO), |_pg| Ok(()))
        .expect_err("a zero timeout would fail every call at once");
    assert!(matches!(error, SpawnError::InvalidTimeout(_)), "{error}");
    assert!(error.to_string().contains("positive duration"), "{error}");
}

#[test]
fn a_thread_the_os_refuses_is_an_error_and_the_started_ranks_are_released_at_once() {
    // Rank 2 of 3 cannot start; ranks 0 and 1 are already in an all-reduce
    // that needs it, with a timeout far longer than the test may take.
    let started = std::time::Instant::now();
    let options = SpawnOptions::new(3).timeout(Duration::from_secs(60)).refuse_thread_of_rank(2);
    let error = spawn_with(options, |pg| {
        let mut t = ddp_workbook::tch::Tensor::from(1.0);
        pg.all_reduce(&mut t, ddp_workbook::dist::ReduceOp::Sum)?;
        Ok(())
    })
    .expect_err("a rank that never started cannot take part");
    assert!(matches!(error, SpawnError::ThreadStart { rank: 2, .. }), "{error}");
    assert!(error.to_string().contains("refused to start rank 2"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10), "the started ranks waited {:?}", started.elapsed());
}

#[test]
fn a_libtorch_failure_is_one_line_of_cause_printed_once() {
    let error = spawn_with(SpawnOptions::new(1).timeout(Duration::from_secs(5)), |pg| {
        let t = Tensor::ones([6], (Kind::Float, Device::Cpu));
        // A view that cannot exist: libtorch's message comes with its C++ stack.
        let _view = t.f_view([4, 4]).map_err(ddp_workbook::dist::torch_error(pg.as_ref(), "reshaping"))?;
        Ok(())
    })
    .expect_err("the view must fail");
    let message = format!("{error:#}");
    println!("{message}");
    assert_eq!(message.lines().count(), 1, "one line: {message}");
    assert!(message.contains("reshaping failed in libtorch: shape '[4, 4]' is invalid"), "{message}");
    assert!(!message.contains("Internal torch error") && !message.contains("frame #"), "{message}");
    assert_eq!(message.matches("is invalid").count(), 1, "the cause printed once: {message}");
}
