//! Chapter 11 tests, part 4: a checkpoint that gathers the shards, and runs
//! that resume from it. Compiled into `cargo test --test chapter_11` (see
//! `tests/chapter_11.rs`).
//!
//! The chapter's MLP trains for 4 AdamW steps on global batches of 12 rows
//! (4, 6 or 3 per rank on 3, 2 or 4 ranks). After 2 steps rank 0 writes the
//! weights and `ShardedAdamW::gathered_state` to a safetensors file; a fresh
//! run on the same or another world size loads it (each rank cutting its
//! own shards out of it) and takes steps 3 and 4. It must end where one
//! process that never stopped ends, within `TOLERANCE`, and on the same
//! world size bitwise where the uninterrupted sharded run ends. Plain AdamW
//! loads the same file too: the state has `AdamW::state`'s names and shapes.

use std::ops::Range;
use std::path::{Path, PathBuf};

use ddp_workbook::ch11_zero::{AdamW, Replicated, ShardedAdamW};
use ddp_workbook::check::{max_reference_diff, snapshot};
use ddp_workbook::data::Regression;
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::{Kind, Tensor};

use super::step_bucket::likely_cause;
use super::training::{adamw_one_process, CAPS, CHECK_SHARD_OF, LR, SIZES, WEIGHT_DECAY};
use crate::common::{mse, run, Named, TOLERANCE};

const MODEL_SEED: i64 = 41;
const GLOBAL_ROWS: i64 = 12; // divides by 2, 3 and 4
const STEPS: usize = 4;
const SAVED_AFTER: usize = 2;

fn data() -> Regression {
    Regression::new(42, GLOBAL_ROWS * STEPS as i64, 4, 1, Kind::Double)
}

/// A file of its own per call: tests run side by side. Removed on drop.
struct CheckpointFile(PathBuf);

impl CheckpointFile {
    fn new(what: &str) -> CheckpointFile {
        let name = format!("ddp-workbook-ch11-{}-{what}.safetensors", std::process::id());
        CheckpointFile(std::env::temp_dir().join(name))
    }
}

impl Drop for CheckpointFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0); // a test's leftover; nothing to do if it fails
    }
}

/// ZeRO-1 on `world_size` ranks over global batches `steps`, each rank on
/// its GLOBAL_ROWS / N rows; first loading `resume_from` (weights as
/// `param.<name>`, the rest the optimizer state) if given; at the end, every
/// rank gathers the state and rank 0 writes it with the weights to
/// `save_to`. Returns rank 0's parameters after each step.
fn zero_run(
    world_size: usize,
    steps: Range<usize>,
    resume_from: Option<&Path>,
    save_to: Option<&Path>,
) -> Vec<Named> {
    let per_rank = run(world_size, |pg: Group| {
        let data = data();
        let (vs, module) = Mlp::seeded(MODEL_SEED, SIZES, Kind::Double);
        let model = Replicated::new(module, &vs, pg.clone())?;
        let mut optimizer = ShardedAdamW::new(model.parameters(), pg.clone(), CAPS, LR, WEIGHT_DECAY)?;
        if let Some(path) = resume_from {
            let saved = Tensor::read_safetensors(path)?;
            for (name, param) in model.parameters() {
                let key = format!("param.{name}");
                let weights = saved.iter().find(|(n, _)| *n == key).map(|(_, t)| t);
                let weights = weights.ok_or_else(|| anyhow::anyhow!("the checkpoint has no `{key}`"))?;
                ddp_workbook::tch::no_grad(|| param.shallow_clone().copy_(weights));
                // into its bucket
            }
            let state: Named = saved.into_iter().filter(|(n, _)| !n.starts_with("param.")).collect();
            optimizer.load_state(&state)?;
        }
        let rows = GLOBAL_ROWS / world_size as i64;
        let mut after = vec![];
        for step in steps.clone() {
            optimizer.zero_grad();
            let (x, y) = data.batch(step as i64 * GLOBAL_ROWS + pg.rank() as i64 * rows, rows);
            mse(&model.forward(&x), &y).backward();
            optimizer.step()?;
            after.push(snapshot(model.parameters()));
        }
        let state = optimizer.gathered_state()?; // a collective: every rank
        if let (0, Some(path)) = (pg.rank(), save_to) {
            let weights = model.parameters().iter().map(|(n, p)| (format!("param.{n}"), p.detach()));
            let entries: Named = weights.chain(state).collect();
            Tensor::write_safetensors(&entries, path)?;
        }
        Ok(after)
    });
    per_rank.into_iter().next().expect("rank 0 ran")
}

/// One process, AdamW on every whole global batch, never stopped.
fn one_process() -> Vec<Named> {
    adamw_one_process(MODEL_SEED, &data(), GLOBAL_ROWS, STEPS)
}

/// What to check when a resumed run ends elsewhere.
fn what_to_check() -> String {
    likely_cause(&format!(
        "{CHECK_SHARD_OF}; if ZeRO-1 takes plain DDP's steps too (the training test passes), the \
         checkpoint lost something: gathered_state and load_state (src/ddp/zero/mod.rs) must carry \
         both moments and the step count"
    ))
}

#[test]
fn a_gathered_checkpoint_resumes_on_the_same_or_another_world_size() {
    let reference = one_process();
    for (saved_on, resumed_on) in [(3, 3), (3, 2), (2, 4)] {
        let file = CheckpointFile::new(&format!("{saved_on}-{resumed_on}"));
        zero_run(saved_on, 0..SAVED_AFTER, None, Some(&file.0));
        let resumed = zero_run(resumed_on, SAVED_AFTER..STEPS, Some(&file.0), None);
        let off = max_reference_diff(&resumed[STEPS - SAVED_AFTER - 1], &reference[STEPS - 1]);
        let case = format!(
            "saved on {saved_on} ranks after {SAVED_AFTER} of {STEPS} steps, resumed on {resumed_on}"
        );
        let compared =
            format!("the final weights vs one process that never stopped: {off:e} (tolerance {TOLERANCE:e})");
        assert!(off <= TOLERANCE, "{case}: {compared}. {}", what_to_check());
        println!("{case}: {compared}");
        if saved_on == resumed_on {
            let uninterrupted = zero_run(saved_on, 0..STEPS, None, None);
            let gap = max_reference_diff(&resumed[STEPS - SAVED_AFTER - 1], &uninterrupted[STEPS - 1]);
            assert_eq!(
                gap,
                0.0,
                "{case}: the final weights vs the uninterrupted run on {saved_on} ranks differ by {gap:e} \
                 (tolerance 0: a resume on the same ranks repeats the same arithmetic). {}",
                what_to_check()
            );
        }
    }
}

#[test]
fn plain_adamw_resumes_from_the_gathered_checkpoint() {
    let file = CheckpointFile::new("plain");
    zero_run(3, 0..SAVED_AFTER, None, Some(&file.0));
    let saved = Tensor::read_safetensors(&file.0).expect("the checkpoint reads");
    let data = data();
    let (vs, model) = Mlp::seeded(7, SIZES, Kind::Double); // other weights: the checkpoint's replace them
    for (name, mut param) in named_parameters(&vs) {
        let weights = &saved.iter().find(|(n, _)| *n == format!("param.{name}")).expect("weights saved").1;
        ddp_workbook::tch::no_grad(|| param.copy_(weights));
    }
    let mut optimizer = AdamW::new(&named_parameters(&vs), LR, WEIGHT_DECAY);
    let state: Named = saved.into_iter().filter(|(n, _)| !n.starts_with("param.")).collect();
    optimizer.load_state(&state).expect("AdamW loads the gathered state");
    for step in SAVED_AFTER..STEPS {
        optimizer.zero_grad();
        let (x, y) = data.batch(step as i64 * GLOBAL_ROWS, GLOBAL_ROWS);
        mse(&ddp_workbook::tch::nn::Module::forward(&model, &x), &y).backward();
        optimizer.step().expect("AdamW steps");
    }
    let off = max_reference_diff(&snapshot(&named_parameters(&vs)), &one_process()[STEPS - 1]);
    let case = format!(
        "saved by ZeRO-1 on 3 ranks after {SAVED_AFTER} of {STEPS} steps, resumed by plain AdamW in one \
         process: the final weights vs one process that never stopped: {off:e} (tolerance {TOLERANCE:e})"
    );
    assert!(off <= TOLERANCE, "{case}. {}", what_to_check());
    println!("{case}");
}
