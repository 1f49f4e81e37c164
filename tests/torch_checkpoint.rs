//! Checkpoints both ways between the workbook and PyTorch, through
//! safetensors: a training run's checkpoint loads into the PyTorch GPT twin
//! (scripts/torch/models.py) and gives the held-out loss the run reported;
//! a PyTorch `state_dict` saved with `safetensors.torch.save_file` loads into
//! the workbook's GPT with `load_model_weights` and gives PyTorch's forward.
//! The PyTorch side is scripts/torch/checkpoint_both_ways.py.
//!
//! Run: `cargo test --features solutions,mpi,nccl --test torch_checkpoint -- --nocapture`
//! (prints the measured differences; needs `.venv`, made by scripts/setup.sh).

#[path = "torch/venv.rs"]
mod venv;

use std::path::{Path, PathBuf};

use ddp_workbook::data::TokenTask;
use ddp_workbook::models::{Gpt, GptConfig};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Kind, Tensor};
use ddp_workbook::train::{self, checkpoint::load_model_weights, TrainConfig};

const SCRIPT: &str = "scripts/torch/checkpoint_both_ways.py";

/// A fresh folder for this test's files (removed first if a previous run left it).
fn scratch(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ddp-workbook-torch-checkpoint-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}

#[test]
fn a_training_checkpoint_gives_the_same_held_out_loss_in_the_pytorch_twin() {
    let dir = scratch("held-out");
    let path = dir.join("run.safetensors");
    let config = TrainConfig {
        world_size: 2,
        batch_size: 4,
        accum_steps: 2,
        steps: 8,
        warmup_steps: 2,
        train_sequences: 64,
        eval_sequences: 64,
        log_every: 4,
        checkpoint: Some(path.clone()),
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    };
    let outcomes =
        train::train(&config, &|_| {}).unwrap_or_else(|e| panic!("the training run failed: {e:#}"));
    let ours = outcomes[0].evaluation.as_ref().expect("rank 0 evaluates the model after the last step");

    // The held-out sequences, drawn as `train::evaluate` draws them.
    let held_out = TokenTask::standard(config.seed as i64 + 1, config.eval_sequences as i64);
    let (inputs, targets, mask) = held_out.batch(0, held_out.len()); // narrowed views: copy them whole
    let (inputs, targets, mask) = (inputs.contiguous(), targets.contiguous(), mask.contiguous());
    let held_out_path = dir.join("held_out.safetensors");
    Tensor::write_safetensors(&[("inputs", &inputs), ("targets", &targets), ("mask", &mask)], &held_out_path)
        .expect("writing the held-out sequences");

    let printed = venv::python(SCRIPT, &["held-out-loss", arg(&path), arg(&held_out_path)]);
    let json: serde_json::Value = serde_json::from_str(printed.trim()).expect("one JSON line");
    let (loss, accuracy) = (json["loss"].as_f64().unwrap(), json["accuracy"].as_f64().unwrap());
    let relative = (loss - ours.loss).abs() / ours.loss;
    println!(
        "held-out loss: workbook {:.9}, PyTorch twin {loss:.9} ({}), relative difference {relative:.1e}; \
         accuracy {} and {accuracy}",
        ours.loss, json["dtype"], ours.accuracy
    );
    // float32: the twin runs the same libtorch operations in the same order;
    // only a different split of a sum over threads could change the last bits.
    assert!(
        relative <= 1e-5,
        "the twin's held-out loss {loss} is not the run's {} (relative {relative:e})",
        ours.loss
    );
    assert_eq!(accuracy, ours.accuracy, "the twin's held-out accuracy");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pytorch_state_dict_saved_with_safetensors_gives_pytorchs_forward_in_the_workbook() {
    let dir = scratch("state-dict");
    venv::python(SCRIPT, &["save-state-dict", arg(&dir)]);
    let forward: Vec<(String, Tensor)> = Tensor::read_safetensors(dir.join("forward.safetensors")).unwrap();
    let named = |name: &str| forward.iter().find(|(n, _)| n == name).map(|(_, t)| t.shallow_clone()).unwrap();
    let (tokens, pytorch_logits) = (named("tokens"), named("logits")); // [3, 32], [3, 32, 16]

    let (vs, gpt) = Gpt::seeded(11, &GptConfig::tiny(), Kind::Double); // the workbook's own weights...
    let before = (gpt.forward(&tokens) - &pytorch_logits).abs().max().double_value(&[]);
    load_model_weights(&vs, &dir.join("gpt.safetensors")).unwrap_or_else(|e| panic!("{e}")); // ...replaced
    let after = (gpt.forward(&tokens) - &pytorch_logits).abs().max().double_value(&[]);
    println!(
        "logits against PyTorch's: {before:.1e} apart with the workbook's weights, {after:.1e} after loading"
    );
    assert!(before > 1e-3, "the control: other weights must give other logits");
    // float64, the same operations in the same order (the twin's promise).
    assert!(after <= 1e-12, "loaded from PyTorch's state_dict, the forward is {after:e} from PyTorch's");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrapped_or_incomplete_state_dict_is_refused_with_what_to_do() {
    let dir = scratch("refused");
    venv::python(SCRIPT, &["save-state-dict", arg(&dir)]);
    let tensors = Tensor::read_safetensors(dir.join("gpt.safetensors")).unwrap();
    let (vs, _gpt) = Gpt::seeded(11, &GptConfig::tiny(), Kind::Double);

    // DDP's own state_dict() names every tensor "module.<name>".
    let wrapped: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (format!("module.{n}"), t)).collect();
    Tensor::write_safetensors(&wrapped, dir.join("wrapped.safetensors")).unwrap();
    let error =
        load_model_weights(&vs, &dir.join("wrapped.safetensors")).expect_err("DDP's names").to_string();
    assert!(error.contains("model.module.state_dict()"), "{error}");

    let missing: Vec<(String, &Tensor)> =
        tensors.iter().filter(|(n, _)| n != "ln_f.weight").map(|(n, t)| (n.clone(), t)).collect();
    Tensor::write_safetensors(&missing, dir.join("missing.safetensors")).unwrap();
    let error =
        load_model_weights(&vs, &dir.join("missing.safetensors")).expect_err("no ln_f.weight").to_string();
    assert!(error.contains("ln_f.weight"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}
