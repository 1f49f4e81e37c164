//! What every training run (plain DDP, ZeRO-2, FSDP) does after each
//! optimizer step, the same whatever shards what: time the step, keep this
//! rank's loss, and every `log_every` steps report the global batch's loss
//! and accuracy. The strategies differ in how they step and checkpoint, not
//! in what they log.

use std::time::Duration;

use tch::Tensor;

use super::config::TrainConfig;
use super::outcome::Event;
use crate::data::masked_accuracy;

/// The steps' times and losses so far, the window of steps since the last
/// log line (its throughput), and where and how often to report.
pub(super) struct StepLog<'a> {
    rank: usize,
    last_step: usize,
    log_every: usize,
    tokens_per_step: f64,
    on_event: &'a (dyn Fn(Event) + Sync),
    /// This rank's loss of every step, in order.
    pub losses: Vec<f64>,
    /// The steps' time together.
    pub train_time: Duration,
    window: (Duration, usize),
}

impl<'a> StepLog<'a> {
    /// For this rank of a run that ends at `last_step`; each step trains on
    /// `tokens_per_step` tokens over all ranks.
    pub fn new(
        config: &TrainConfig,
        rank: usize,
        last_step: usize,
        tokens_per_step: f64,
        on_event: &'a (dyn Fn(Event) + Sync),
    ) -> Self {
        let (losses, train_time, window) = (Vec::new(), Duration::ZERO, (Duration::ZERO, 0));
        let log_every = config.log_every;
        StepLog { rank, last_step, log_every, tokens_per_step, on_event, losses, train_time, window }
    }

    /// Records a step that took `elapsed` and ended with this rank's loss
    /// `rank_loss` (the sum of its micro-batches' losses, each divided by `k`).
    pub fn stepped(&mut self, elapsed: Duration, rank_loss: f64) {
        self.train_time += elapsed;
        self.window = (self.window.0 + elapsed, self.window.1 + 1);
        self.losses.push(rank_loss);
    }

    // ANCHOR: report
    /// Every `log_every` steps and at the last, the global batch's loss and
    /// accuracy (`last_micro_batch`: logits, targets, mask), with the step's
    /// learning rate `lr` and the tokens per second since the last log line;
    /// then that the step is done. `mean_over_ranks` is an all-reduce: every
    /// rank calls this, rank 0 alone reports.
    pub fn report(
        &mut self,
        step: usize,
        lr: f64,
        last_micro_batch: Option<(Tensor, Tensor, Tensor)>,
        mean_over_ranks: impl Fn(f64) -> anyhow::Result<f64>,
    ) -> anyhow::Result<()> {
        let (rank, on_event) = (self.rank, self.on_event);
        if step.is_multiple_of(self.log_every) || step == self.last_step {
            // Every rank takes part in the two all-reduces; rank 0 alone prints.
            let (logits, targets, mask) = last_micro_batch.expect("k >= 1 micro-batches");
            let accuracy = tch::no_grad(|| masked_accuracy(&logits, &targets, &mask));
            let rank_loss = *self.losses.last().expect("stepped before report");
            let (loss, accuracy) = (mean_over_ranks(rank_loss)?, mean_over_ranks(accuracy)?);
            let tokens_per_second = self.window.1 as f64 * self.tokens_per_step / self.window.0.as_secs_f64();
            if rank == 0 {
                on_event(Event::Logged { step, loss, accuracy, lr, tokens_per_second });
            }
            self.window = (Duration::ZERO, 0);
        }
        if rank == 0 {
            on_event(Event::Stepped { step });
        }
        Ok(())
    }
    // ANCHOR_END: report

    /// Tokens per second over the whole run's steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.losses.len() as f64 * self.tokens_per_step / self.train_time.as_secs_f64().max(1e-9)
    }
}
