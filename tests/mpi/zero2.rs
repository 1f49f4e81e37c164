//! ZeRO-2 (the library's `ShardGradOp`) on real processes under `mpirun`:
//! each bucket reduce-scattered during backward through the MPI backend
//! (whose `reduce_scatter_async` runs in place), AdamW on the shards, the
//! parameters all-gathered. After every step, every process holds bitwise
//! the same parameters, within TOLERANCE of one process with the training
//! run's AdamW on the whole global batch; and the step sends what DDP's
//! all-reduce sends on a ring.

use ddp_workbook::check::compare_to_reference;
use ddp_workbook::data::Regression;
use ddp_workbook::ddp::{BucketCaps, ShardGradOp};
use ddp_workbook::dist::Group;
use ddp_workbook::models::{named_parameters, Mlp};
use ddp_workbook::tch::nn::Module;
use ddp_workbook::tch::{Kind, Tensor};
use ddp_workbook::train::AdamW;

use crate::common::{mse, TOLERANCE};
use crate::harness::on_ranks;

const SIZES: &[i64] = &[4, 6, 2]; // 44 parameters: one bucket, no padding on 2 ranks
const GLOBAL_BATCH: i64 = 12;
const STEPS: usize = 3;
const LR: f64 = 0.01;
const WEIGHT_DECAY: f64 = 0.1;

fn data() -> Regression {
    Regression::new(5, GLOBAL_BATCH * STEPS as i64, 4, 2, Kind::Double)
}

fn one_process() -> Vec<Vec<(String, Tensor)>> {
    let (vs, model) = Mlp::seeded(7, SIZES, Kind::Double);
    let mut optimizer = AdamW::new(&named_parameters(&vs), LR, WEIGHT_DECAY);
    let mut after = vec![];
    for s in 0..STEPS {
        optimizer.zero_grad();
        let (x, y) = data().batch(s as i64 * GLOBAL_BATCH, GLOBAL_BATCH);
        mse(&model.forward(&x), &y).backward();
        optimizer.step().expect("AdamW steps");
        after.push(ddp_workbook::check::snapshot(&named_parameters(&vs)));
    }
    after
}

fn zero2(pg: Group) -> anyhow::Result<()> {
    let (world, rank) = (pg.world_size(), pg.rank());
    let (vs, module) = Mlp::seeded(7, SIZES, Kind::Double);
    let mut model = ShardGradOp::new(module, &vs, pg.clone(), BucketCaps::default(), LR, WEIGHT_DECAY)?;
    let reference = one_process();
    let rows = GLOBAL_BATCH / world as i64;
    for (s, expected) in reference.iter().enumerate() {
        let before = pg.stats();
        model.zero_grad()?;
        let (x, y) = data().batch(s as i64 * GLOBAL_BATCH + rank as i64 * rows, rows);
        model.backward(&mse(&model.forward(&x), &y))?;
        model.step()?;
        let sent = pg.stats().since(&before);
        let params = model.parameters();
        let flat = Tensor::cat(&params.iter().map(|(_, p)| p.detach().flatten(0, -1)).collect::<Vec<_>>(), 0);
        for (other, theirs) in pg.all_gather(&flat)?.iter().enumerate() {
            anyhow::ensure!(
                theirs.equal(&flat),
                "step {}: rank {other}'s parameters differ from rank {rank}'s",
                s + 1
            );
        }
        compare_to_reference(params, expected, TOLERANCE)
            .map_err(|report| anyhow::anyhow!("ZeRO-2 on MPI, step {}: {report}", s + 1))?;
        // One bucket of 44 f64 gradients, no padding on 2 ranks: a
        // reduce-scatter and an all-gather of 352 bytes each, plus the
        // end-of-backward check's all-reduce of (2 * 4 parameters + world) int32 flags.
        let n = world as f64;
        let ddp = 2.0 * (n - 1.0) / n * (352.0 + 4.0 * (8 + world) as f64);
        if world == 2 {
            anyhow::ensure!(
                (sent.ring_wire_bytes(world) - ddp).abs() < 1e-9,
                "step {}: ZeRO-2 sent {} bytes on a ring, DDP's all-reduce {ddp}",
                s + 1,
                sent.ring_wire_bytes(world)
            );
        }
    }
    Ok(())
}

#[test]
fn zero2_on_2_processes_equals_one_process_and_sends_ddps_bytes() {
    on_ranks(2, "zero2::zero2_on_2_processes_equals_one_process_and_sends_ddps_bytes", zero2);
}

#[test]
fn zero2_on_3_processes_equals_one_process() {
    on_ranks(3, "zero2::zero2_on_3_processes_equals_one_process", zero2);
}
