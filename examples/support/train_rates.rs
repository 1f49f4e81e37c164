//! How the head-to-head benchmarks read the speed of the workbook's
//! training run: rank 0's logs, after the untimed warm-up steps, and the
//! lines a measured program prints (`tokens_per_second N`, `step_ms T`).
//! Included with `#[path = "support/train_rates.rs"] mod train_rates;` by
//! bench_vs_pytorch.rs and bench_sizes.rs, next to vs_pytorch_tables.rs as
//! `mod tables` (its `Rate`).

use std::process::Command;
use std::sync::Mutex;

use ddp_workbook::data::TokenTask;
use ddp_workbook::train::{Event, TrainConfig};

use super::commands::{lines_of, stdout_of};
use super::tables::Rate;

/// The rate over the steps after the warm-up, from rank 0's logs: each
/// `(step, tokens/s)` covers the steps since the previous log, and the run
/// logs every `config.log_every` steps, its warm-up.
pub fn timed_rate(logs: &[(usize, f64)], config: &TrainConfig) -> anyhow::Result<Rate> {
    let tokens_per_step = (config.global_batch() as i64 * TokenTask::standard(0, 1).seq_len()) as f64;
    let (mut steps, mut seconds, mut previous) = (0, 0.0, 0);
    for &(step, rate) in logs {
        if previous >= config.log_every {
            steps += step - previous;
            seconds += (step - previous) as f64 * tokens_per_step / rate;
        }
        previous = step;
    }
    anyhow::ensure!(steps > 0, "no timed steps in the logs {logs:?}");
    Ok(Rate {
        tokens_per_second: steps as f64 * tokens_per_step / seconds,
        step_ms: seconds / steps as f64 * 1e3,
    })
}

/// Runs `run` with an event handler that keeps rank 0's logs, and returns
/// them (none on the other ranks). `also` sees every event first.
pub fn logged(
    also: &(dyn Fn(&Event) + Sync),
    run: impl FnOnce(&(dyn Fn(Event) + Sync)) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<(usize, f64)>> {
    let logs = Mutex::new(vec![]);
    run(&|event| {
        also(&event);
        if let Event::Logged { step, tokens_per_second, .. } = event {
            logs.lock().unwrap().push((step, tokens_per_second));
        }
    })?;
    Ok(logs.into_inner().unwrap())
}

/// The rate a command printed (`tokens_per_second N` and `step_ms T`), and its whole stdout.
pub fn rate_of(command: Command) -> anyhow::Result<(Rate, String)> {
    let stdout = stdout_of(command)?;
    let tokens_per_second = lines_of(&stdout, "tokens_per_second")?[0][0];
    Ok((Rate { tokens_per_second, step_ms: lines_of(&stdout, "step_ms")?[0][0] }, stdout))
}
