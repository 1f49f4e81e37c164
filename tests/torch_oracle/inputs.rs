//! What the oracle (scripts/torch/oracle.py)
//! reads, written from the stages of stages.rs: stages.json, and per stage
//! the initial weights and each rank's batches, as safetensors.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use std::path::Path;

use ddp_workbook::models::GptConfig;
use ddp_workbook::tch::Tensor;

use super::stages::{build, micro_batch, stages, FsdpUnits, ModelSpec, NoSync, Stage, StageOptimizer};

fn json(stage: &Stage) -> String {
    let model = match stage.model {
        ModelSpec::Mlp(sizes) => format!(r#"{{"kind": "mlp", "sizes": {sizes:?}}}"#),
        ModelSpec::Branchy(sizes) => format!(r#"{{"kind": "branchy", "sizes": {sizes:?}}}"#),
        ModelSpec::Gpt => {
            let c = GptConfig::tiny();
            format!(
                r#"{{"kind": "gpt", "config": {{"vocab_size": {}, "block_size": {}, "n_layer": {}, "n_head": {}, "n_embd": {}}}}}"#,
                c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd
            )
        }
    };
    let no_sync = match stage.no_sync {
        NoSync::Never => "none",
        NoSync::AllButLast => "all_but_last",
        NoSync::ForwardOnly => "forward_only",
    };
    let optimizer = match stage.optimizer {
        StageOptimizer::Sgd => "sgd",
        StageOptimizer::AdamW => "adamw",
        StageOptimizer::Zero1 => "zero1",
    };
    let first_bucket_bytes = stage.torch_first_bucket_bytes.map_or("null".to_string(), |b| b.to_string());
    // Both of the workbook's bf16 hooks face PyTorch's one.
    let comm_hook = if stage.bf16_hook.is_some() { r#""bf16_compress_hook""# } else { "null" };
    let fsdp = match stage.fully_shard {
        None => "null".to_string(),
        Some(f) => {
            let units = match f.units {
                FsdpUnits::PerBlock => "blocks",
                FsdpUnits::Root => "root",
            };
            format!(r#"{{"units": "{units}", "reshard_after_forward": {}}}"#, f.reshard_after_forward)
        }
    };
    format!(
        r#"{{"name": "{}", "model": {model}, "ddp": {}, "first_bucket_bytes": {first_bucket_bytes}, "steps": {}, "micro_batches": {}, "no_sync": "{no_sync}", "record_micro_batches": {}, "lr": {:?}, "comm_hook": {comm_hook}, "optimizer": "{optimizer}", "weight_decay": {:?}, "fsdp": {fsdp}}}"#,
        stage.name,
        stage.torch_ddp,
        stage.steps,
        stage.micro_batches,
        stage.record_micro_batches,
        stage.lr,
        stage.weight_decay
    )
}

/// Writes what the oracle reads for `world_size` ranks into `dir`.
pub fn write_inputs(dir: &Path, world_size: usize) -> anyhow::Result<()> {
    let stages = stages();
    let listed: Vec<String> = stages.iter().map(json).collect();
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("stages.json"), format!("{{\"stages\": [\n{}\n]}}\n", listed.join(",\n")))?;
    for stage in &stages {
        let folder = dir.join(stage.name);
        std::fs::create_dir_all(&folder)?;
        let (vs, _) = build(&stage.model);
        let weights: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        Tensor::write_safetensors(&weights, folder.join("weights.safetensors"))?;
        for rank in 0..world_size {
            let mut tensors = Vec::new();
            for step in 0..stage.steps {
                for m in 0..stage.micro_batches {
                    let b = micro_batch(stage, rank, step, m);
                    let key = format!("step{step}.mb{m}");
                    tensors.push((format!("{key}.input"), b.input));
                    tensors.push((format!("{key}.target"), b.target));
                    tensors.push((format!("{key}.use_branch"), Tensor::from(b.use_branch as i64)));
                }
            }
            Tensor::write_safetensors(&tensors, folder.join(format!("batches_rank{rank}.safetensors")))?;
        }
    }
    Ok(())
}
