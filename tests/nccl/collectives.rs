//! Every collective and point-to-point call of
//! the NCCL backend on every GPU, against results computed on the host from
//! what each rank held, and the refusals in words. Needs a GPU; run with
//!   cargo test --features nccl --test nccl -- --include-ignored

use approx::{abs_diff_eq, relative_eq};
use ddp_workbook::dist::{nccl, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::{gpus, with_one_gpu};

/// What `op` makes of the ranks' values, computed on the host.
fn reduce_on_host(op: ReduceOp, values: &[f64]) -> f64 {
    match op {
        ReduceOp::Sum => values.iter().sum(),
        ReduceOp::Product => values.iter().product(),
        ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => values.iter().sum::<f64>() / values.len() as f64,
    }
}

const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

/// Rank r holds r + 2 and -(r + 2). With two ranks or more the five
/// operations give five different results, so a wrong mapping (Product
/// for Min, Sum for Avg) fails; with one rank every result is the value.
fn rank_values(rank: usize) -> [f64; 2] {
    let v = rank as f64 + 2.0;
    [v, -v]
}

#[test]
#[ignore = "needs a GPU: with one, a world of one (every reduction keeps its value); two or more tell the five operations apart"]
fn reductions_give_each_operation_its_own_result_on_every_gpu() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "which reduction NCCL applies");
    let held: Vec<[f64; 2]> = (0..world).map(rank_values).collect();
    let expected: Vec<[f64; 2]> = OPS
        .iter()
        .map(|&op| [0, 1].map(|i| reduce_on_host(op, &held.iter().map(|v| v[i]).collect::<Vec<_>>())))
        .collect();
    if world > 1 {
        for (a, b) in (0..OPS.len()).flat_map(|a| (a + 1..OPS.len()).map(move |b| (a, b))) {
            assert_ne!(expected[a][0], expected[b][0], "{:?} and {:?} must differ", OPS[a], OPS[b]);
        }
    }
    nccl::spawn_on_gpus(world, |pg| {
        let gpu = Device::Cuda(pg.rank());
        let mine = rank_values(pg.rank());
        for (&op, want) in OPS.iter().zip(&expected) {
            let mut t = Tensor::from_slice(&mine).to_device(gpu);
            pg.all_reduce(&mut t, op)?;
            let got = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
            let close = relative_eq!(got.as_slice(), want.as_slice(), epsilon = 1e-12, max_relative = 1e-12);
            anyhow::ensure!(close, "rank {}: all_reduce({op:?}) gave {got:?}, expected {want:?}", pg.rank());
        }
        // The asynchronous path: the call returns, the wait polls the event.
        let avg = Tensor::from_slice(&mine.map(|v| v as f32)).to_device(gpu);
        pg.all_reduce_async(&avg, ReduceOp::Avg)?.wait()?;
        let want = expected[4][0] as f32;
        anyhow::ensure!(
            abs_diff_eq!(avg.double_value(&[0]) as f32, want, epsilon = 1e-5),
            "async avg {avg:?}, want {want}"
        );
        // A CPU tensor is staged through the GPU and copied back.
        let mut cpu = Tensor::from_slice(&mine);
        pg.all_reduce(&mut cpu, ReduceOp::Sum)?;
        anyhow::ensure!(cpu.device() == Device::Cpu, "the CPU tensor moved");
        anyhow::ensure!(cpu.double_value(&[1]) == expected[0][1], "staged sum {cpu:?}");
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a GPU: with one, a world of one, where a send to oneself is refused; the ring of sends needs two"]
fn broadcast_gather_scatter_and_sends_on_every_gpu() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "moving data between ranks");
    let n = world as i64;
    nccl::spawn_on_gpus(world, |pg| {
        let (rank, gpu) = (pg.rank() as i64, Device::Cuda(pg.rank()));
        // Broadcast from the last rank: every rank gets its values.
        let mut b = Tensor::from_slice(&[10 * (rank + 1); 3]).to_device(gpu);
        pg.broadcast(&mut b, world - 1)?;
        anyhow::ensure!(Vec::<i64>::try_from(b.to_device(Device::Cpu))? == [10 * n; 3], "broadcast {b:?}");
        // All-gather: rank q's [q + 1, (q + 1)^2] in slot q.
        let mine = Tensor::from_slice(&[(rank + 1) as f32, ((rank + 1) * (rank + 1)) as f32]).to_device(gpu);
        let gathered = pg.all_gather(&mine)?;
        let got: Vec<Vec<f32>> = gathered
            .iter()
            .map(|t| Vec::<f32>::try_from(t.to_device(Device::Cpu)))
            .collect::<Result<_, _>>()?;
        let want: Vec<Vec<f32>> = (1..=n).map(|q| vec![q as f32, (q * q) as f32]).collect();
        anyhow::ensure!(got == want, "all_gather gave {got:?}, expected {want:?}");
        // Reduce-scatter: row i of rank q holds (q + 1) * (i + 1); rank r
        // gets row r summed over the ranks, (r + 1) * (1 + 2 + ... + n).
        let rows =
            Tensor::arange_start(1, n + 1, (Kind::Float, gpu)).unsqueeze(1).repeat([1, 2]) * (rank + 1);
        let chunk = pg.reduce_scatter(&rows, ReduceOp::Sum)?;
        let want = ((rank + 1) * (1..=n).sum::<i64>()) as f32;
        anyhow::ensure!(
            Vec::<f32>::try_from(chunk.reshape([-1]).to_device(Device::Cpu))? == [want; 2],
            "reduce_scatter {chunk:?}, want {want}"
        );
        pg.barrier()?;
        let one = Tensor::from_slice(&[rank as f32 + 1.0]).to_device(gpu);
        if world == 1 {
            let refused = pg.send(&one, 0).expect_err("a send to oneself").to_string();
            anyhow::ensure!(refused.contains("cannot send to itself"), "{refused}");
            return Ok(());
        }
        // Chapter 1's ring: every rank sends first and receives second.
        let (next, prev) = ((pg.rank() + 1) % world, (pg.rank() + world - 1) % world);
        pg.send(&one, next)?;
        pg.send(&(&one * 10), next)?; // a second message: NCCL pairs them by order
        let (mut first, mut second) =
            (Tensor::zeros([1], (Kind::Float, gpu)), Tensor::zeros([1], (Kind::Float, gpu)));
        pg.recv(&mut first, prev)?;
        pg.recv(&mut second, prev)?;
        let got = (first.double_value(&[0]), second.double_value(&[0]));
        anyhow::ensure!(
            got == (prev as f64 + 1.0, 10.0 * (prev as f64 + 1.0)),
            "ring from rank {prev}: {got:?}"
        );
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a GPU: the refusal of a tensor on another GPU needs two"]
fn tensors_the_backend_cannot_take_are_refused_in_words() {
    let (world, _turn) = gpus();
    with_one_gpu(world, "the refusal of a tensor on another GPU");
    nccl::spawn_on_gpus(world, |pg| {
        let gpu = Device::Cuda(pg.rank());
        let refusal = |t: &Tensor, op| pg.all_reduce_async(t, op).err().map(|e| e.to_string());
        if world > 1 {
            let elsewhere = Tensor::zeros([1], (Kind::Float, Device::Cuda((pg.rank() + 1) % world)));
            let error = refusal(&elsewhere, ReduceOp::Sum).expect("a tensor on another GPU is refused");
            anyhow::ensure!(error.contains("to_device(group.device())"), "{error}");
        }
        let ints = Tensor::zeros([1], (Kind::Int64, gpu));
        let error = refusal(&ints, ReduceOp::Avg).expect("an integer average is refused");
        anyhow::ensure!(error.contains("floating-point"), "{error}");
        let flags = Tensor::zeros([1], (Kind::Bool, gpu));
        let error = refusal(&flags, ReduceOp::Sum).expect("a boolean sum is refused");
        anyhow::ensure!(error.contains("min or max"), "{error}");
        let error = refusal(&Tensor::new(), ReduceOp::Sum).expect("an undefined tensor is refused");
        anyhow::ensure!(error.contains("undefined"), "{error}");
        // The refused calls queued nothing: the group still works.
        let mut t = Tensor::ones([1], (Kind::Float, gpu));
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        anyhow::ensure!(t.double_value(&[0]) == world as f64, "sum after the refusals: {t:?}");
        Ok(())
    })
    .unwrap();
}
