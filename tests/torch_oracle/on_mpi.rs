//! Every stage of the cross-check with the
//! workbook's ranks as MPI processes (scripts/launch.sh, through the MPI
//! tests' harness: the test binary starts itself as the ranks), against the
//! same PyTorch runs as the in-process ranks. One job per world size runs
//! every stage; each rank writes its tensors, the test compares them.
//! The `fsdp_*` stages run the library's FSDP (`fsdp::sharded`) on MPI
//! against PyTorch's `fully_shard`, bitwise on 2 and 3 ranks (fsdp.rs says
//! why they agree), and the ZeRO-2 stages (`fsdp::ZERO2_STAGES`) run the
//! library's ZeRO-2 (`workbook::train_zero2`) too: bitwise on 2 ranks,
//! within the bound on 3 (fsdp.rs says why not bitwise there).
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use std::path::{Path, PathBuf};

use ddp_workbook::tch::Tensor;

use crate::compare::Agreement;
use crate::fsdp::ZERO2_STAGES;
use crate::stages::{stages, NoSync};
use crate::workbook::{train, train_zero2, RankRun};
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
                    if ZERO2_STAGES.contains(&stage.name) {
                        let run = train_zero2(&stage, pg.clone())?;
                        let zero2 = dir.join(format!("{}_zero2", stage.name));
                        std::fs::create_dir_all(&zero2)?;
                        Tensor::write_safetensors(
                            &run.tensors,
                            zero2.join(format!("rank{rank}.safetensors")),
                        )?;
                    }
                }
                Ok(())
            },
        );
        let Some(job) = job else { return }; // a rank: its part is done
        assert!(job.success, "the MPI job on {world_size} ranks failed:\n{}", job.output);
        let read = |dir: &str| -> Vec<RankRun> {
            (0..world_size)
                .map(|rank| {
                    let path = out.join(dir).join(format!("rank{rank}.safetensors"));
                    let mut tensors = Tensor::read_safetensors(&path)
                        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                    tensors.sort_by(|a, b| a.0.cmp(&b.0));
                    RankRun::from_tensors(tensors)
                })
                .collect()
        };
        for stage in stages() {
            let runs = read(stage.name);
            if ZERO2_STAGES.contains(&stage.name) {
                let zero2 = read(&format!("{}_zero2", stage.name));
                let agreement = Agreement::on(world_size);
                let compared = match agreement {
                    Agreement::Bitwise => |_: &str| true,
                    Agreement::Close => crate::stages::compared(&stage, world_size),
                };
                check_against_torch(stage.name, world_size, &zero2, agreement, compared);
            }
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
