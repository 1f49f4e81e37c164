//! The workbook's shuffled `DistributedSampler` hands every rank exactly the
//! indices PyTorch's does: scripts/torch/sampler_indices.py prints PyTorch's
//! shards for 1836 configurations (17 lengths, 6 world sizes, both
//! drop_last, 3 seeds, 3 epochs) and this test compares each one. Also: one
//! case worked by hand, the configurations PyTorch leaves empty are refused,
//! and drawing an order leaves libtorch's global generator where it was.
//!
//! Run: `cargo test --features solutions,mpi,nccl --test torch_sampler`
//! (needs `.venv`, made by scripts/setup.sh).

#[path = "torch/venv.rs"]
mod venv;

use ddp_workbook::ddp::{permutation, DistributedSampler, SamplerError, SamplerOptions};
use ddp_workbook::tch::{self, Kind, Tensor};

fn sampler(
    len: i64,
    world_size: usize,
    rank: usize,
    seed: u64,
    drop_last: bool,
) -> Result<DistributedSampler, SamplerError> {
    DistributedSampler::with_options(len, world_size, rank, SamplerOptions { shuffle: true, seed, drop_last })
}

#[test]
fn every_rank_gets_pytorchs_indices_in_every_configuration() {
    let printed = venv::python("scripts/torch/sampler_indices.py", &[]);
    let json: serde_json::Value =
        serde_json::from_str(&printed).expect("sampler_indices.py prints one JSON object");
    let configurations = json["configurations"].as_array().expect("a list of configurations");
    let (mut compared, mut refused) = (0, 0);
    for configuration in configurations {
        let len = configuration["len"].as_i64().unwrap();
        let world_size = configuration["world_size"].as_u64().unwrap() as usize;
        let drop_last = configuration["drop_last"].as_bool().unwrap();
        let seed = configuration["seed"].as_u64().unwrap();
        let epoch = configuration["epoch"].as_u64().unwrap();
        let shards: Vec<Vec<i64>> = serde_json::from_value(configuration["shards"].clone()).unwrap();
        let what =
            format!("len {len}, {world_size} ranks, drop_last {drop_last}, seed {seed}, epoch {epoch}");
        for (rank, pytorch) in shards.iter().enumerate() {
            match sampler(len, world_size, rank, seed, drop_last) {
                Ok(mut ours) => {
                    ours.set_epoch(epoch);
                    assert_eq!(
                        ours.indices(),
                        *pytorch,
                        "{what}, rank {rank}: ours (left) against PyTorch's"
                    );
                    assert_eq!(ours.len(), pytorch.len(), "{what}, rank {rank}: len()");
                    compared += 1;
                }
                Err(error) => {
                    // Refused exactly where PyTorch hands this rank nothing.
                    assert!(
                        pytorch.is_empty(),
                        "{what}, rank {rank}: refused ({error}), PyTorch gives {pytorch:?}"
                    );
                    assert!(matches!(error, SamplerError::EmptyShards { .. }), "{what}: {error}");
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(configurations.len(), 1836, "the script's configurations changed: update this file's doc");
    println!(
        "{} configurations from torch {}: {compared} shards equal, {refused} refused (PyTorch: empty)",
        configurations.len(),
        json["torch"]
    );
    assert!(compared > 0 && refused > 0);
}

#[test]
fn ten_examples_on_four_ranks_by_hand() {
    // g = torch.Generator(); g.manual_seed(0); torch.randperm(10, generator=g)
    // printed [4, 1, 7, 5, 3, 9, 0, 8, 6, 2] with torch 2.11.0.
    let order = vec![4, 1, 7, 5, 3, 9, 0, 8, 6, 2];
    assert_eq!(permutation(10, 0), order);
    // Padded to 12 by repeating the first two (4, 1); rank r takes r, r+4, r+8.
    let padded = [vec![4, 3, 6], vec![1, 9, 2], vec![7, 0, 4], vec![5, 8, 1]];
    // Dropped to 8; rank r takes r, r+4.
    let dropped = [vec![4, 3], vec![1, 9], vec![7, 0], vec![5, 8]];
    for rank in 0..4 {
        assert_eq!(sampler(10, 4, rank, 0, false).unwrap().indices(), padded[rank], "rank {rank}, padded");
        assert_eq!(sampler(10, 4, rank, 0, true).unwrap().indices(), dropped[rank], "rank {rank}, dropped");
    }
    // Seed 0 at epoch 3 is seed 3 at epoch 0, as in PyTorch.
    let mut later = sampler(10, 4, 1, 0, false).unwrap();
    later.set_epoch(3);
    assert_eq!(later.epoch_order(), permutation(10, 3));
    assert_ne!(permutation(10, 3), order);
}

#[test]
fn the_configurations_where_pytorch_hands_a_rank_nothing_are_refused() {
    // PyTorch accepts these and every rank's shard is empty.
    for (len, world_size, drop_last) in
        [(0, 1, false), (0, 3, false), (0, 2, true), (1, 2, true), (4, 5, true)]
    {
        let error = sampler(len, world_size, 0, 0, drop_last).expect_err("an empty shard");
        let message = error.to_string();
        assert!(message.contains("empty shard") && message.contains("drop_last"), "{message}");
    }
    // The smallest that PyTorch fills: every rank gets one index.
    assert_eq!(sampler(5, 5, 4, 0, true).unwrap().len(), 1);
    assert_eq!(sampler(1, 5, 4, 0, false).unwrap().indices(), vec![0]);
}

#[test]
fn a_seed_plus_epoch_past_64_bits_wraps_around() {
    // PyTorch's manual_seed refuses seed + epoch above u64::MAX; the
    // workbook wraps around (chapter 7's exercise adds with wrapping_add).
    let mut last = sampler(10, 1, 0, u64::MAX, false).unwrap();
    last.set_epoch(1);
    assert_eq!(last.indices(), permutation(10, 0));
}

#[test]
fn drawing_an_order_leaves_the_global_generator_alone() {
    tch::manual_seed(21);
    let expected = Tensor::rand([8], (Kind::Double, tch::Device::Cpu));
    tch::manual_seed(21);
    let _ = permutation(1000, 21);
    let _ = sampler(97, 3, 2, 5, false).unwrap().indices();
    let drawn = Tensor::rand([8], (Kind::Double, tch::Device::Cpu));
    assert!(drawn.equal(&expected), "the shuffle moved the global generator: {drawn} against {expected}");
}
