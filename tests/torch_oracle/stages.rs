//! What the cross-check runs: each stage's
//! model, how the workbook syncs it, the matching DistributedDataParallel
//! arguments, and the batches every rank trains on. Both sides build from
//! here: the workbook's ranks directly, PyTorch from the files that
//! inputs.rs writes (stages.json, weights, batches).
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.

use ddp_workbook::ddp::{BucketCaps, MIB};
use ddp_workbook::models::{Gpt, GptConfig, Mlp};
use ddp_workbook::tch::nn::{Module, VarStore};
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

use super::branchy::Branchy;

/// A bucket cap small enough to split the tiny GPT into many buckets
/// (its largest gradient, `mlp.fc.weight` in f64, is 128 KiB).
pub const SMALL_CAP_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug)]
pub enum ModelSpec {
    Mlp(&'static [i64]),
    Gpt,
    /// `[inputs, hidden, outputs]` ([`Branchy`]).
    Branchy(&'static [i64]),
}

/// How the workbook averages the gradients.
#[derive(Clone, Copy, Debug)]
pub enum WorkbookSync {
    /// `ddp::naive::sync_gradients` after a plain backward: one all-reduce
    /// per parameter.
    Naive,
    /// The finished `SimpleDistributedDataParallelism`, with these caps.
    Wrapper { caps: BucketCaps, find_unused: bool },
}

/// Which micro-batches of a step run under `no_sync`, and how.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NoSync {
    Never,
    /// Forward and backward of every micro-batch but the last inside it.
    AllButLast,
    /// Every micro-batch but the last: the forward inside, the backward
    /// after the scope closed.
    ForwardOnly,
}

/// Chapter 12's communication hook on both sides: PyTorch's DDP registers
/// its own `bf16_compress_hook`, the workbook's wrapper one of its two.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bf16Hook {
    /// `ddp::bf16_compress_hook`, the workbook's order: divided before the
    /// cast, so one rounding less than PyTorch's on 3 ranks.
    WorkbookOrder,
    /// `ddp::bf16_compress_hook_pytorch_order`, with the bf16 sums in
    /// gloo's order (gloo_order.rs): PyTorch's arithmetic, bit for bit.
    PyTorchOrder,
}

/// Which optimizer steps the parameters, on both sides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StageOptimizer {
    /// `p -= lr * grad`, written out on both sides; gradients zeroed in
    /// place (as tch does).
    Sgd,
    /// The training run's `AdamW`; PyTorch's `AdamW(foreach=False)`, whose
    /// `zero_grad` sets the gradients to `None`.
    AdamW,
    /// ZeRO-1: the library's `ShardedAdamW`, every backward inside
    /// `no_sync`; PyTorch's `ZeroRedundancyOptimizer(optimizer_class=AdamW)`
    /// under its DDP. The gradients differ by design (the workbook keeps
    /// each rank's own until the step averages them): only the forward and
    /// the parameters are compared.
    Zero1,
}

/// When Branchy's forward takes its branch (steps counted from 1 here,
/// from 0 in the code).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Branches {
    /// In step 1 rank 1 skips the branch (the others use it: PyTorch
    /// averages what they computed), in step 2 every rank does.
    Rank1SkipsStep1,
    /// Used by every rank in steps 1, 2 and 4, by none in 3 and 5: the
    /// optimizer must leave it as it is in 3 and 5.
    Gap,
    /// Used by no rank in steps 1 and 2, by every rank from step 3: its
    /// first update counts as its first step in the bias correction.
    Late,
    /// Two micro-batches per step: in steps 1, 3 and 5 only the first uses
    /// the branch (the step has a gradient for it, though the last backward
    /// does not touch it), in steps 2 and 4 neither does.
    FirstMicroBatchOnly,
}

impl Branches {
    /// Whether rank `rank` takes the branch in micro-batch `m` of `step`.
    pub fn uses_branch(self, step: usize, rank: usize, m: usize) -> bool {
        match self {
            Branches::Rank1SkipsStep1 => !matches!((step, rank), (1, 1) | (2, _)),
            Branches::Gap => !matches!(step, 2 | 4),
            Branches::Late => step >= 2,
            Branches::FirstMicroBatchOnly => m == 0 && step.is_multiple_of(2),
        }
    }
}

/// Where PyTorch's side applies `fully_shard` (FSDP2), in a stage trained
/// under FSDP2 instead of DDP.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FsdpUnits {
    /// Each transformer block is a unit, the rest of the GPT the root's.
    PerBlock,
    /// One unit: the whole model.
    Root,
}

/// `fully_shard`'s arguments for a stage.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FullyShard {
    pub units: FsdpUnits,
    /// True: each unit's gathered parameters are freed after its forward
    /// and gathered again for its backward (FULL_SHARD, ZeRO-3); false:
    /// kept until the backward (SHARD_GRAD_OP, ZeRO-2).
    pub reshard_after_forward: bool,
}

#[derive(Clone, Debug)]
pub struct Stage {
    pub name: &'static str,
    pub model: ModelSpec,
    pub sync: WorkbookSync,
    /// DistributedDataParallel's keyword arguments, as JSON.
    pub torch_ddp: &'static str,
    /// `dist._DEFAULT_FIRST_BUCKET_BYTES` while PyTorch builds its DDP, if
    /// not its 1 MiB.
    pub torch_first_bucket_bytes: Option<usize>,
    pub steps: usize,
    pub micro_batches: usize,
    pub no_sync: NoSync,
    /// Write the gradients after every micro-batch, not only the last.
    pub record_micro_batches: bool,
    pub lr: f64,
    /// A bf16 hook on both wrappers (chapter 12), or none.
    pub bf16_hook: Option<Bf16Hook>,
    pub optimizer: StageOptimizer,
    /// AdamW's decoupled weight decay (not used by SGD).
    pub weight_decay: f64,
    pub branches: Branches,
    /// PyTorch trains this stage with `fully_shard` instead of its DDP
    /// (`torch_ddp` unused): tests/torch_oracle/fsdp.rs.
    pub fully_shard: Option<FullyShard>,
}

const MLP: &[i64] = &[4, 16, 16, 1];
const BRANCHY: &[i64] = &[4, 8, 1];
/// Wider than MLP: more elements for the bf16 hook to round.
const BF16_MLP: &[i64] = &[8, 64, 64, 4];
const MLP_ROWS: i64 = 4; // per rank and micro-batch
const GPT_ROWS: i64 = 2;
const MODEL_SEED: i64 = 11;

fn small_caps() -> BucketCaps {
    // PyTorch's bucket_cap_mb caps every bucket, the first too.
    BucketCaps { cap_bytes: SMALL_CAP_BYTES, first_cap_bytes: SMALL_CAP_BYTES }
}

/// 1000 bytes: PyTorch's bucket_cap_mb = 1000 / 2^20, exact in binary.
pub const MLP_CAP_BYTES: usize = 1000;

fn mlp_caps() -> BucketCaps {
    BucketCaps { cap_bytes: MLP_CAP_BYTES, first_cap_bytes: MLP_CAP_BYTES }
}

fn stage(name: &'static str, model: ModelSpec, sync: WorkbookSync, torch_ddp: &'static str) -> Stage {
    Stage {
        name,
        model,
        sync,
        torch_ddp,
        torch_first_bucket_bytes: None,
        steps: 3,
        micro_batches: 1,
        no_sync: NoSync::Never,
        record_micro_batches: false,
        lr: 0.1,
        bf16_hook: None,
        optimizer: StageOptimizer::Sgd,
        weight_decay: 0.0,
        branches: Branches::Rank1SkipsStep1,
        fully_shard: None,
    }
}

/// A stage stepped by AdamW or ZeRO-1 (`optimizer`), 5 steps, with weight
/// decay: a parameter stepped on a zero gradient moves.
fn adamw_stage(
    name: &'static str,
    model: ModelSpec,
    sync: WorkbookSync,
    torch_ddp: &'static str,
    optimizer: StageOptimizer,
    branches: Branches,
) -> Stage {
    Stage {
        steps: 5,
        lr: 0.01,
        optimizer,
        weight_decay: 0.1,
        branches,
        ..stage(name, model, sync, torch_ddp)
    }
}

/// Every stage, in the order the oracle runs them.
pub fn stages() -> Vec<Stage> {
    let wrapper = WorkbookSync::Wrapper { caps: BucketCaps::default(), find_unused: false };
    let small = WorkbookSync::Wrapper { caps: small_caps(), find_unused: false };
    let unused = WorkbookSync::Wrapper { caps: BucketCaps::default(), find_unused: true };
    let mlp_small = WorkbookSync::Wrapper { caps: mlp_caps(), find_unused: false };
    vec![
        stage("naive", ModelSpec::Mlp(MLP), WorkbookSync::Naive, "{}"),
        stage("buckets_default", ModelSpec::Gpt, wrapper, "{}"),
        stage("buckets_small", ModelSpec::Gpt, small, r#"{"bucket_cap_mb": 0.0625}"#),
        Stage {
            micro_batches: 2,
            no_sync: NoSync::AllButLast,
            ..stage("no_sync", ModelSpec::Mlp(MLP), wrapper, "{}")
        },
        Stage {
            micro_batches: 2,
            no_sync: NoSync::ForwardOnly,
            record_micro_batches: true,
            ..stage("no_sync_forward_only", ModelSpec::Mlp(MLP), wrapper, "{}")
        },
        Stage {
            steps: 4,
            ..stage("find_unused", ModelSpec::Branchy(BRANCHY), unused, r#"{"find_unused_parameters": true}"#)
        },
        // Layouts (layouts.rs): a cap that splits the MLP, with and without
        // find_unused_parameters (then PyTorch never rebuilds its buckets).
        stage("mlp_small_cap", ModelSpec::Mlp(MLP), mlp_small, r#"{"bucket_cap_mb": 0.00095367431640625}"#),
        // A cap below every gradient's size: one bucket per parameter.
        stage(
            "mlp_tiny_cap",
            ModelSpec::Mlp(MLP),
            WorkbookSync::Wrapper {
                caps: BucketCaps { cap_bytes: 8, first_cap_bytes: 8 },
                find_unused: false,
            },
            r#"{"bucket_cap_mb": 7.62939453125e-06}"#,
        ),
        // The default cap, with PyTorch's first-bucket cap lowered to 1000 B.
        Stage {
            torch_first_bucket_bytes: Some(MLP_CAP_BYTES),
            ..stage(
                "mlp_first_cap",
                ModelSpec::Mlp(MLP),
                WorkbookSync::Wrapper {
                    caps: BucketCaps { first_cap_bytes: MLP_CAP_BYTES, ..BucketCaps::default() },
                    find_unused: false,
                },
                "{}",
            )
        },
        stage(
            "mlp_small_cap_unused",
            ModelSpec::Mlp(MLP),
            WorkbookSync::Wrapper { caps: mlp_caps(), find_unused: true },
            r#"{"bucket_cap_mb": 0.00095367431640625, "find_unused_parameters": true}"#,
        ),
        stage(
            "bucket_view",
            ModelSpec::Gpt,
            small,
            r#"{"bucket_cap_mb": 0.0625, "gradient_as_bucket_view": true}"#,
        ),
        // AdamW and ZeRO-1 (with small caps, ShardedAdamW has several
        // buckets, their shards cutting through parameters), on the MLP and
        // the tiny GPT, then both with a branch that no rank uses in some steps.
        adamw_stage(
            "adamw",
            ModelSpec::Mlp(MLP),
            wrapper,
            "{}",
            StageOptimizer::AdamW,
            Branches::Rank1SkipsStep1,
        ),
        adamw_stage(
            "zero1",
            ModelSpec::Mlp(MLP),
            mlp_small,
            "{}",
            StageOptimizer::Zero1,
            Branches::Rank1SkipsStep1,
        ),
        adamw_stage(
            "adamw_gpt",
            ModelSpec::Gpt,
            wrapper,
            "{}",
            StageOptimizer::AdamW,
            Branches::Rank1SkipsStep1,
        ),
        adamw_stage(
            "zero1_gpt",
            ModelSpec::Gpt,
            small,
            "{}",
            StageOptimizer::Zero1,
            Branches::Rank1SkipsStep1,
        ),
        adamw_stage("adamw_unused_gap", branchy(), unused, FIND_UNUSED, StageOptimizer::AdamW, Branches::Gap),
        adamw_stage(
            "adamw_unused_late",
            branchy(),
            unused,
            FIND_UNUSED,
            StageOptimizer::AdamW,
            Branches::Late,
        ),
        adamw_stage("zero1_unused_gap", branchy(), unused, FIND_UNUSED, StageOptimizer::Zero1, Branches::Gap),
        adamw_stage(
            "zero1_unused_late",
            branchy(),
            unused,
            FIND_UNUSED,
            StageOptimizer::Zero1,
            Branches::Late,
        ),
        Stage {
            micro_batches: 2,
            no_sync: NoSync::AllButLast,
            ..adamw_stage(
                "adamw_unused_no_sync",
                branchy(),
                unused,
                FIND_UNUSED,
                StageOptimizer::AdamW,
                Branches::FirstMicroBatchOnly,
            )
        },
        // Two micro-batches, each synced: the branch used in the first only.
        Stage {
            micro_batches: 2,
            ..adamw_stage(
                "adamw_unused_two_syncs",
                branchy(),
                unused,
                FIND_UNUSED,
                StageOptimizer::AdamW,
                Branches::FirstMicroBatchOnly,
            )
        },
        Stage {
            micro_batches: 2,
            no_sync: NoSync::AllButLast, // PyTorch's side; ZeRO-1 sends nothing in backward
            ..adamw_stage(
                "zero1_unused_no_sync",
                branchy(),
                unused,
                FIND_UNUSED,
                StageOptimizer::Zero1,
                Branches::FirstMicroBatchOnly,
            )
        },
    ]
    .into_iter()
    .chain(bf16_stages())
    .chain(fully_shard_stages())
    .collect()
}

/// The MLP with a last layer of 2 rows: on 3 ranks `fully_shard` leaves
/// rank 2 no row of `layers.1.weight` and `layers.1.bias` (MLP's last layer,
/// of 1 row, leaves ranks 1 and 2 none, and rank 1 none on 2 ranks).
const TWO_ROW_MLP: &[i64] = &[4, 16, 2];

/// PyTorch's FSDP2 (`fully_shard`) against what the workbook has: its DDP
/// wrapper with the same optimizer (tests/torch_oracle/fsdp.rs says why
/// they must agree). The tiny GPT per block and at the root, the MLPs at
/// the root, resharding after forward or not, SGD and AdamW; gradient
/// accumulation; a branch no rank uses in steps 3 and 5. Two steps (the
/// branch's five): each stage runs in CI, on 2 and 3 ranks, in-process
/// and on MPI.
fn fully_shard_stages() -> Vec<Stage> {
    let wrapper = WorkbookSync::Wrapper { caps: BucketCaps::default(), find_unused: false };
    let unused = WorkbookSync::Wrapper { caps: BucketCaps::default(), find_unused: true };
    let shard = |units, reshard_after_forward| Some(FullyShard { units, reshard_after_forward });
    let sgd = |name, model, fully_shard| Stage { steps: 2, fully_shard, ..stage(name, model, wrapper, "{}") };
    let adamw = |name, model, fully_shard| Stage {
        steps: 2,
        fully_shard,
        ..adamw_stage(name, model, wrapper, "{}", StageOptimizer::AdamW, Branches::Rank1SkipsStep1)
    };
    use FsdpUnits::{PerBlock, Root};
    vec![
        sgd("fsdp_gpt_sgd", ModelSpec::Gpt, shard(PerBlock, true)),
        sgd("fsdp_gpt_sgd_keep", ModelSpec::Gpt, shard(PerBlock, false)),
        adamw("fsdp_gpt_adamw", ModelSpec::Gpt, shard(PerBlock, true)),
        adamw("fsdp_gpt_adamw_keep", ModelSpec::Gpt, shard(PerBlock, false)),
        adamw("fsdp_gpt_root_adamw", ModelSpec::Gpt, shard(Root, true)),
        sgd("fsdp_mlp_sgd", ModelSpec::Mlp(MLP), shard(Root, true)),
        adamw("fsdp_mlp_adamw_keep", ModelSpec::Mlp(MLP), shard(Root, false)),
        sgd("fsdp_two_rows", ModelSpec::Mlp(TWO_ROW_MLP), shard(Root, true)),
        // Accumulation: set_requires_gradient_sync(False) on PyTorch's
        // side, no_sync on the workbook's.
        Stage {
            steps: 2,
            micro_batches: 2,
            no_sync: NoSync::AllButLast,
            ..sgd("fsdp_gpt_accumulate", ModelSpec::Gpt, shard(PerBlock, true))
        },
        // The branch no rank uses in steps 3 and 5: FSDP2 reduces only the
        // parameters with a gradient, and AdamW skips the rest.
        Stage {
            fully_shard: shard(Root, true),
            ..adamw_stage(
                "fsdp_unused_gap",
                branchy(),
                unused,
                FIND_UNUSED,
                StageOptimizer::AdamW,
                Branches::Gap,
            )
        },
    ]
}

/// Chapter 12's hook, in both orders, on an MLP of 4,996 parameters with
/// one bucket per parameter on both sides: gloo's order of additions
/// depends on where an element lies in its bucket (gloo_order.rs), and a
/// bucket of one parameter holds it where PyTorch's does. PyTorch uses
/// those buckets from the first step only with find_unused_parameters
/// (without it, its first step runs one bucket of every gradient, ordered
/// otherwise than the workbook's; layouts.rs).
fn bf16_stages() -> Vec<Stage> {
    let one_per_parameter =
        WorkbookSync::Wrapper { caps: BucketCaps { cap_bytes: 8, first_cap_bytes: 8 }, find_unused: true };
    let torch = r#"{"bucket_cap_mb": 7.62939453125e-06, "find_unused_parameters": true}"#;
    let with = |name, hook| Stage {
        bf16_hook: Some(hook),
        ..stage(name, ModelSpec::Mlp(BF16_MLP), one_per_parameter, torch)
    };
    vec![with("bf16_hook", Bf16Hook::WorkbookOrder), with("bf16_hook_pytorch_order", Bf16Hook::PyTorchOrder)]
}

const FIND_UNUSED: &str = r#"{"find_unused_parameters": true}"#;

fn branchy() -> ModelSpec {
    ModelSpec::Branchy(BRANCHY)
}

pub fn by_name(name: &str) -> Stage {
    stages().into_iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no stage named {name}"))
}

/// What a stage compares on `world_size` ranks, by tensor name: everything,
/// but on 3 ranks not the GPT's `attn.qkv.bias` when AdamW steps it. The
/// loss does not depend on the key part of that bias (softmax ignores a
/// constant added to every score of a row), so its gradient is rounding
/// noise, about 1e-17, which differs with the order of the 3-rank sum; and
/// AdamW divides each gradient by its own running size, so it turns that
/// noise into steps of about `lr`, different noise into different steps.
/// On 2 ranks the noise is the same bits on both sides, and so is the rest.
pub fn compared(stage: &Stage, world_size: usize) -> fn(&str) -> bool {
    let adamw_on_the_gpt = matches!(stage.model, ModelSpec::Gpt) && stage.optimizer != StageOptimizer::Sgd;
    if world_size == 3 && adamw_on_the_gpt {
        |name| !name.contains("attn.qkv.bias")
    } else {
        |_| true
    }
}

/// Checked by the test that the PyTorch side reads 0.0625 MiB as 64 KiB.
pub const SMALL_CAP_MB: f64 = SMALL_CAP_BYTES as f64 / MIB as f64;

/// The model of a stage, on every rank alike.
#[derive(Debug)]
pub enum Twin {
    Mlp(Mlp),
    Gpt(Box<Gpt>),
    Branchy(Branchy),
}

impl Module for Twin {
    fn forward(&self, xs: &Tensor) -> Tensor {
        match self {
            Twin::Mlp(m) => m.forward(xs),
            Twin::Gpt(m) => m.forward(xs),
            Twin::Branchy(m) => m.forward(xs),
        }
    }
}

impl Twin {
    /// Sets the branch of step `step` on `rank` (a no-op but for Branchy).
    pub fn choose_branch(&self, use_branch: bool) {
        if let Twin::Branchy(m) = self {
            m.set_use_branch(use_branch);
        }
    }
}

/// The stage's model in f64, the same on every rank and every run.
pub fn build(spec: &ModelSpec) -> (VarStore, Twin) {
    match spec {
        ModelSpec::Mlp(sizes) => {
            let (vs, m) = Mlp::seeded(MODEL_SEED, sizes, Kind::Double);
            (vs, Twin::Mlp(m))
        }
        ModelSpec::Gpt => {
            let (vs, m) = Gpt::seeded(MODEL_SEED, &GptConfig::tiny(), Kind::Double);
            (vs, Twin::Gpt(Box::new(m)))
        }
        ModelSpec::Branchy(sizes) => with_seed(MODEL_SEED, || {
            let mut vs = VarStore::new(Device::Cpu);
            let m = Branchy::new(&vs.root(), sizes);
            vs.set_kind(Kind::Double);
            (vs, Twin::Branchy(m))
        }),
    }
}

/// One micro-batch of one rank: input, target, and whether the forward
/// takes the branch (Branchy only).
pub struct MicroBatch {
    pub input: Tensor,
    pub target: Tensor,
    pub use_branch: bool,
}

/// Rank `rank`'s micro-batch `m` of step `step`: seeded by its place, so
/// that every world size draws its ranks' batches the same way.
pub fn micro_batch(stage: &Stage, rank: usize, step: usize, m: usize) -> MicroBatch {
    let seed = 1000 + (step * 100 + m * 10 + rank) as i64;
    let (input, target) = with_seed(seed, || match stage.model {
        ModelSpec::Mlp(sizes) | ModelSpec::Branchy(sizes) => {
            let (inputs, outputs) = (sizes[0], *sizes.last().unwrap());
            let options = (Kind::Double, Device::Cpu);
            (Tensor::randn([MLP_ROWS, inputs], options), Tensor::randn([MLP_ROWS, outputs], options))
        }
        ModelSpec::Gpt => {
            let cfg = GptConfig::tiny();
            let shape = [GPT_ROWS, cfg.block_size];
            let options = (Kind::Int64, Device::Cpu);
            (Tensor::randint(cfg.vocab_size, shape, options), Tensor::randint(cfg.vocab_size, shape, options))
        }
    });
    MicroBatch { input, target, use_branch: stage.branches.uses_branch(step, rank, m) }
}

/// The stage's loss, with the operations the oracle uses.
pub fn loss(stage: &Stage, output: &Tensor, target: &Tensor) -> Tensor {
    let loss = match stage.model {
        ModelSpec::Gpt => {
            let vocab = output.size()[2];
            output.log_softmax(-1, Kind::Double).reshape([-1, vocab]).nll_loss(&target.reshape([-1]))
        }
        _ => output.mse_loss(target, ddp_workbook::tch::Reduction::Mean),
    };
    loss / stage.micro_batches as f64
}
