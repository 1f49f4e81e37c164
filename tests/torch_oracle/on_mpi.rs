//! Every stage of the cross-check with the
//! workbook's ranks as MPI processes (scripts/launch.sh, through the MPI
//! tests' harness: the test binary starts itself as the ranks), against the
//! same PyTorch runs as the in-process ranks. One job per world size runs
//! every stage; each rank writes its tensors, the test compares them.
//! The `fsdp_*` stages run the library's FSDP (`fsdp::sharded`) on MPI
//! against PyTorch's `fully_shard`, bitwise on 2 and 3 ranks (fsdp.rs says
//! why they agree).
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use std::path::{Path, PathBuf};

use ddp_workbook::tch::Tensor;

use crate::compare::Agreement;
use crate::stages::{stages, NoSync};
use crate::workbook::{train, RankRun};
use crate::{after_the_deferred_sync, check_against_torch, harness};

/// Where the job's ranks write (read by the ranks from the environment).
const OUT: &str = "TORCH_ORACLE_MPI_OUT";

#[test]
fn on_mpi_every_stage_equals_pytorch_ddp() {
    for world_size in [2, 3] {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("torch_oracle_mpi_{}_{world_size}", std::process::id()));
        let out_text = out.to_string_lossy().to_string();
        let job = harness::launch(
            world_size,
            "on_mpi::on_mpi_every_stage_equals_pytorch_ddp",
            &[(OUT, &out_text)],
            |pg| {
                let dir = PathBuf::from(std::env::var(OUT)?);
                let rank = pg.rank();
                for stage in stages() {
                    let run = if stage.fully_shard.is_some() {
                        crate::fsdp::sharded(&stage, pg.clone())?
                    } else {
                        train(&stage, pg.clone())?
                    };
                    std::fs::create_dir_all(dir.join(stage.name))?;
                    Tensor::write_safetensors(
                        &run.tensors,
                        dir.join(stage.name).join(format!("rank{rank}.safetensors")),
                    )?;
                }
                Ok(())
            },
        );
        let Some(job) = job else { return }; // a rank: its part is done
        assert!(job.success, "the MPI job on {world_size} ranks failed:\n{}", job.output);
        for stage in stages() {
            let runs: Vec<RankRun> = (0..world_size)
                .map(|rank| {
                    let path = out.join(stage.name).join(format!("rank{rank}.safetensors"));
                    let mut tensors = Tensor::read_safetensors(&path)
                        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                    tensors.sort_by(|a, b| a.0.cmp(&b.0));
                    RankRun::from_tensors(tensors)
                })
                .collect();
            if stage.fully_shard.is_some() {
                check_against_torch(stage.name, world_size, &runs, Agreement::Bitwise, |_| true);
            } else if stage.no_sync == NoSync::ForwardOnly {
                check_against_torch(stage.name, world_size, &runs, Agreement::Close, after_the_deferred_sync);
            } else if let Some(agreement) = Agreement::of(&stage, world_size) {
                let compared = crate::stages::compared(&stage, world_size);
                check_against_torch(stage.name, world_size, &runs, agreement, compared);
            }
        }
        _ = std::fs::remove_dir_all(&out);
    }
}
