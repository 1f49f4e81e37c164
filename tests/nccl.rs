//! tests/nccl.rs: the NCCL backend. The first tests need no GPU (NCCL's
//! library, its unique id, the errors a machine without a GPU gives); they
//! run everywhere, CI included. The rest need a GPU and are ignored, so the
//! suite reports them as skipped; run them on a GPU machine with
//!   cargo test --features nccl --test nccl -- --include-ignored
//! They use every GPU the machine has (one rank per GPU; with one GPU, a
//! world of one, which still runs every NCCL call).

use ddp_workbook::ddp::SimpleDistributedDataParallelism;
use ddp_workbook::dist::nccl::{self, UniqueId};
use ddp_workbook::dist::{spawn, Group, ReduceOp};
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::nn::{Module, OptimizerConfig, Sgd};
use ddp_workbook::tch::{Device, Kind, Tensor};

const FLOAT_CPU: (Kind, Device) = (Kind::Float, Device::Cpu);
const NEEDS_GPU: &str = "needs a GPU: cargo test --features nccl --test nccl -- --include-ignored";

#[test]
fn nccl_loads_from_the_wheel_and_says_its_version() {
    let version = nccl::version().expect("scripts/setup.sh links .nccl/libnccl.so");
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    // Avg inside the collective needs NCCL 2.10 or newer.
    assert!(parts[0] == 2 && parts[1] >= 10, "NCCL {version} is older than 2.10");
}

#[test]
fn unique_ids_are_made_without_a_gpu_and_differ() {
    let (a, b) = (UniqueId::new().unwrap(), UniqueId::new().unwrap());
    assert_ne!(a, b, "every communicator needs a fresh id");
    assert!(a.0.iter().any(|&byte| byte != 0));
}

/// Without a GPU every way in fails at once, in words, and never panics.
#[test]
fn without_a_gpu_every_entry_point_says_why() {
    let Err(why) = nccl::available() else {
        return eprintln!("this machine has a GPU: the GPU tests below cover it");
    };
    assert!(why.contains("CUDA") || why.contains("GPU"), "{why}");
    let ran = std::sync::atomic::AtomicBool::new(false);
    let spawned = nccl::spawn_on_gpus(1, |_| {
        ran.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    });
    assert_eq!(spawned.unwrap_err(), why);
    assert!(!ran.into_inner(), "no rank may start without a GPU");
    let joined = nccl::join(0, 1, 0, &UniqueId::new().unwrap()).err().unwrap().to_string();
    assert!(joined.contains(&why), "{joined}");
}

/// The MPI path without MPI: rank 0 makes the id and broadcasts it over a
/// CPU group, then every rank joins; here every rank gets the same clear
/// error instead of a hang.
#[test]
fn bootstrap_over_a_cpu_group_fails_cleanly_without_a_gpu() {
    if nccl::available().is_ok() {
        return eprintln!("this machine has a GPU: `bootstrap_then_all_reduce` covers it");
    }
    let errors = spawn(2, |pg: Group| Ok(nccl::bootstrap(pg.as_ref(), pg.rank()).err().unwrap().to_string()));
    for error in errors.unwrap() {
        assert!(error.contains("joining NCCL"), "{error}");
    }
}

/// The GPU tests take turns: two communicators spinning on the same GPUs
/// at once can deadlock each other (NCCL's documentation warns of it).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every GPU, while this test holds the GPUs for itself.
fn gpus() -> (usize, std::sync::MutexGuard<'static, ()>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    (nccl::available().unwrap_or_else(|why| panic!("{NEEDS_GPU}; here: {why}")), turn)
}

#[test]
#[ignore = "needs a GPU"]
fn collectives_on_every_gpu() {
    let (world, _turn) = gpus();
    nccl::spawn_on_gpus(world, |pg| {
        let (rank, n, gpu) = (pg.rank() as f64, world as f64, Device::Cuda(pg.rank()));
        let mut t = Tensor::from_slice(&[rank + 1.0, 2.0]).to_device(gpu);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        assert_eq!(Vec::<f64>::try_from(t.to_device(Device::Cpu))?, [n * (n + 1.0) / 2.0, 2.0 * n]);
        let mut avg = Tensor::from_slice(&[rank as f32]).to_device(gpu);
        pg.all_reduce_async(&avg, ReduceOp::Avg)?.wait()?; // the event, polled
        let _ = &mut avg;
        assert!((avg.double_value(&[0]) - (n - 1.0) / 2.0).abs() < 1e-6);
        for (op, expected) in [(ReduceOp::Max, n - 1.0), (ReduceOp::Min, 0.0), (ReduceOp::Product, 0.0)] {
            let mut t = Tensor::from_slice(&[rank]).to_device(gpu);
            pg.all_reduce(&mut t, op)?;
            assert_eq!(
                t.double_value(&[0]),
                if world == 1 && op == ReduceOp::Product { 0.0 } else { expected }
            );
        }
        let mut b = Tensor::from_slice(&[rank as i64; 3]).to_device(gpu);
        pg.broadcast(&mut b, world - 1)?;
        assert_eq!(Vec::<i64>::try_from(b.to_device(Device::Cpu))?, [world as i64 - 1; 3]);
        let gathered = pg.all_gather(&Tensor::from_slice(&[rank as f32]).to_device(gpu))?;
        assert_eq!(
            gathered.iter().map(|t| t.double_value(&[0])).collect::<Vec<_>>(),
            (0..world).map(|r| r as f64).collect::<Vec<_>>()
        );
        let mine = pg.reduce_scatter(&Tensor::ones([world as i64, 2], (Kind::Float, gpu)), ReduceOp::Sum)?;
        assert_eq!(Vec::<f32>::try_from(mine.reshape([-1]).to_device(Device::Cpu))?, [n as f32; 2]);
        let mut cpu = Tensor::from_slice(&[1.0f32]); // staged through the GPU
        pg.all_reduce(&mut cpu, ReduceOp::Sum)?;
        assert_eq!(cpu.double_value(&[0]), n);
        if world > 1 {
            let (next, prev) = ((pg.rank() + 1) % world, (pg.rank() + world - 1) % world);
            pg.send(&Tensor::from_slice(&[rank as f32]).to_device(gpu), next)?;
            let mut got = Tensor::zeros([1], (Kind::Float, gpu));
            pg.recv(&mut got, prev)?;
            assert_eq!(got.double_value(&[0]), prev as f64);
        }
        pg.barrier()?;
        Ok(())
    })
    .unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn a_tensor_on_another_device_is_refused_in_words() {
    let (world, _turn) = gpus();
    nccl::spawn_on_gpus(world, |pg| {
        let elsewhere = Tensor::zeros([1], (Kind::Float, Device::Cuda((pg.rank() + 1) % world)));
        if world > 1 {
            let error = pg.all_reduce_async(&elsewhere, ReduceOp::Sum).err().unwrap().to_string();
            assert!(error.contains("to_device(group.device())"), "{error}");
        }
        let ints = Tensor::zeros([1], (Kind::Int64, Device::Cuda(pg.rank())));
        let error = pg.all_reduce_async(&ints, ReduceOp::Avg).err().unwrap().to_string();
        assert!(error.contains("floating-point"), "{error}");
        Ok(())
    })
    .unwrap();
}

/// Chapter 5's and 6's proof on CUDA: after `optimizer.step` the replicas
/// are equal, and the step equals one process on the global batch (f32:
/// within 1e-5; the summation order differs from one process's).
#[test]
#[ignore = "needs a GPU"]
fn ddp_on_cuda_matches_one_process_on_the_global_batch() {
    let (world, _turn) = gpus();
    let (per_rank, sizes) = (8i64, [4i64, 32, 32, 1]);
    let batch = || {
        let rows = per_rank * world as i64;
        ddp_workbook::with_seed(7, || {
            (Tensor::randn([rows, 4], FLOAT_CPU), Tensor::randn([rows, 1], FLOAT_CPU))
        })
    };
    let weights = nccl::spawn_on_gpus(world, |pg| {
        let (gpu, (x, y)) = (Device::Cuda(pg.rank()), batch());
        let (mut vs, mlp) = Mlp::seeded(3, &sizes, Kind::Float);
        vs.set_device(gpu);
        let ddp = SimpleDistributedDataParallelism::new(mlp, &vs, pg.clone())?;
        let mut sgd = Sgd::default().build(&vs, 0.1)?;
        let rows = x.narrow(0, per_rank * pg.rank() as i64, per_rank).to_device(gpu);
        let targets = y.narrow(0, per_rank * pg.rank() as i64, per_rank).to_device(gpu);
        sgd.zero_grad();
        ddp.backward(&ddp.forward(&rows).mse_loss(&targets, ddp_workbook::tch::Reduction::Mean))?;
        sgd.step();
        Ok(vs.trainable_variables().iter().map(|p| p.to_device(Device::Cpu)).collect::<Vec<_>>())
    })
    .unwrap();
    let ((vs, mlp), (x, y)) = (Mlp::seeded(3, &sizes, Kind::Float), batch());
    let mut sgd = Sgd::default().build(&vs, 0.1).unwrap();
    sgd.zero_grad();
    mlp.forward(&x).mse_loss(&y, ddp_workbook::tch::Reduction::Mean).backward();
    sgd.step();
    for (i, one) in vs.trainable_variables().iter().enumerate() {
        for replica in &weights {
            assert!(replica[i].equal(&weights[0][i]), "replicas differ after step");
            let gap = (&replica[i] - one).abs().max().double_value(&[]);
            assert!(gap < 1e-5, "parameter {i}: {gap} from one process");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn bootstrap_then_all_reduce() {
    let (_, _turn) = gpus();
    let sums = spawn(1, |pg: Group| {
        let gpu_group = nccl::bootstrap(pg.as_ref(), 0)?;
        let mut t = Tensor::ones([4], (Kind::Float, Device::Cuda(0)));
        ddp_workbook::dist::ProcessGroup::all_reduce(&gpu_group, &mut t, ReduceOp::Sum)?;
        Ok(t.sum(Kind::Float).double_value(&[]))
    })
    .unwrap();
    assert_eq!(sums, [4.0]);
}
