//! The decision guide as arithmetic: how many bytes of model states
//! (parameters, gradients and AdamW's two moments) one device holds under
//! DDP, ZeRO-1, ZeRO-2 and FSDP, for a model of a given parameter count on
//! N devices of a given memory, and which of them fits. Each stage divides
//! one more of the three terms by N, as the chapters build them: ZeRO-1 the
//! optimizer state (chapter 11), ZeRO-2 the gradients (chapter 13), FSDP the
//! parameters (chapter 14); [`MemoryLedger`](super::MemoryLedger) measures
//! the same three on the tensors.
//!
//! What it leaves out, and a real run must add on top: activations (they
//! grow with the batch and the sequence, whatever the sharding), the units
//! FSDP holds gathered at a time, communication buffers and the padding of
//! each shard, libtorch's workspace, and the allocator's fragmentation. So
//! "fits" means the model states fit, with what is left for the rest.
//!
//! A 7-billion parameter model on four 80 GiB devices, in float32:
//!
//! ```
//! use ddp_workbook::ddp::{plan_memory, Precision, ShardingStage, Verdict, GIB};
//! let plan = plan_memory(7e9, 4, 80.0 * GIB, Precision::Float32)?;
//! assert_eq!(
//!     plan.markdown(),
//!     "\
//! | strategy | sharded | parameters | gradients | optimizer state | bytes per parameter | per device | left of 80 GiB (85.9 GB) | fits |
//! | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |
//! | DDP (NO_SHARD) | nothing | 4 | 4 | 8 | 16 | 112.0 GB | -26.1 GB | no |
//! | ZeRO-1 | optimizer state | 4 | 4 | 2 | 10 | 70.0 GB | 15.9 GB | yes |
//! | ZeRO-2 (SHARD_GRAD_OP) | + gradients | 4 | 1 | 2 | 7 | 49.0 GB | 36.9 GB | yes |
//! | FSDP / ZeRO-3 (FULL_SHARD) | + parameters | 1 | 1 | 2 | 4 | 28.0 GB | 57.9 GB | yes |
//! "
//! );
//! assert_eq!(plan.verdict(), Verdict::Shard(ShardingStage::Zero1));
//! // Mixed precision as the ZeRO paper counts it: 2 + 2 + 12 bytes.
//! let mixed = plan_memory(7e9, 4, 80.0 * GIB, Precision::Mixed)?;
//! let gb: Vec<f64> = mixed.rows().iter().map(|row| row.per_device_bytes() / 1e9).collect();
//! assert_eq!(gb, [112.0, 49.0, 38.5, 28.0]);
//! # Ok::<(), ddp_workbook::ddp::PlanError>(())
//! ```

use std::fmt;

/// Bytes in a GiB, the unit device memory is sold in.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// How the model states are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Everything in float32: 4 bytes of parameter, 4 of gradient, 8 of
    /// AdamW moments per parameter.
    Float32,
    /// bf16 (or fp16) parameters and gradients for forward and backward,
    /// and a float32 optimizer state: a master copy of the parameters that
    /// AdamW steps and its two moments (2 + 2 + 12, the ZeRO paper's count).
    Mixed,
}

impl Precision {
    /// The model states of one parameter, unsharded.
    pub fn bytes_per_parameter(self) -> BytesPerParameter {
        match self {
            Precision::Float32 => BytesPerParameter { parameters: 4.0, gradients: 4.0, optimizer_state: 8.0 },
            Precision::Mixed => BytesPerParameter { parameters: 2.0, gradients: 2.0, optimizer_state: 12.0 },
        }
    }

    /// "float32" or "mixed precision (bf16 + float32 AdamW)".
    pub fn describe(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Mixed => "mixed precision (bf16 parameters and gradients, float32 AdamW state)",
        }
    }
}

/// Bytes per parameter of each model state, on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BytesPerParameter {
    pub parameters: f64,
    pub gradients: f64,
    /// AdamW's two moments, and in mixed precision the float32 master copy.
    pub optimizer_state: f64,
}

impl BytesPerParameter {
    /// All three together.
    pub fn total(&self) -> f64 {
        self.parameters + self.gradients + self.optimizer_state
    }
}

/// How much of the model states each device keeps: the stages of the
/// ZeRO paper, named also as PyTorch's FSDP names them where it has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardingStage {
    /// Every device keeps everything (FSDP's `NO_SHARD`).
    Ddp,
    /// The optimizer state is sharded (`ZeroRedundancyOptimizer`).
    Zero1,
    /// And the gradients (FSDP's `SHARD_GRAD_OP`).
    Zero2,
    /// And the parameters (FSDP's `FULL_SHARD`, `fully_shard`).
    Fsdp,
}

impl ShardingStage {
    /// From the least sharding to the most.
    pub const ALL: [ShardingStage; 4] =
        [ShardingStage::Ddp, ShardingStage::Zero1, ShardingStage::Zero2, ShardingStage::Fsdp];

    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            ShardingStage::Ddp => "DDP (NO_SHARD)",
            ShardingStage::Zero1 => "ZeRO-1",
            ShardingStage::Zero2 => "ZeRO-2 (SHARD_GRAD_OP)",
            ShardingStage::Fsdp => "FSDP / ZeRO-3 (FULL_SHARD)",
        }
    }

    /// What it shards beyond the stage before.
    pub fn shards(self) -> &'static str {
        match self {
            ShardingStage::Ddp => "nothing",
            ShardingStage::Zero1 => "optimizer state",
            ShardingStage::Zero2 => "+ gradients",
            ShardingStage::Fsdp => "+ parameters",
        }
    }

    /// One device's bytes per parameter on `devices` devices: the sharded
    /// terms divided by the device count.
    pub fn per_device(self, precision: Precision, devices: usize) -> BytesPerParameter {
        let full = precision.bytes_per_parameter();
        let n = devices as f64;
        let (params, grads, state) = match self {
            ShardingStage::Ddp => (1.0, 1.0, 1.0),
            ShardingStage::Zero1 => (1.0, 1.0, n),
            ShardingStage::Zero2 => (1.0, n, n),
            ShardingStage::Fsdp => (n, n, n),
        };
        BytesPerParameter {
            parameters: full.parameters / params,
            gradients: full.gradients / grads,
            optimizer_state: full.optimizer_state / state,
        }
    }
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("the parameter count must be a positive whole number, got {0}: pass the model's parameter count, e.g. 7e9")]
    Parameters(f64),
    #[error("the device count must be at least 1, got 0: pass how many devices train the model")]
    NoDevices,
    #[error("the device memory must be a positive number of bytes, got {0}: pass the memory of one device, e.g. 80 GiB")]
    DeviceMemory(f64),
}

/// One stage's row of the plan.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanRow {
    pub stage: ShardingStage,
    /// One device's model states per parameter of the model.
    pub bytes_per_parameter: BytesPerParameter,
    parameters: f64,
    device_bytes: f64,
}

impl PlanRow {
    /// One device's bytes of model states.
    pub fn per_device_bytes(&self) -> f64 {
        self.parameters * self.bytes_per_parameter.total()
    }

    /// What is left of the device for what the plan leaves out (negative
    /// when the model states alone do not fit).
    pub fn left_bytes(&self) -> f64 {
        self.device_bytes - self.per_device_bytes()
    }

    /// Whether the model states fit on one device.
    pub fn fits(&self) -> bool {
        self.left_bytes() >= 0.0
    }
}

/// What the decision guide says for a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Everything fits on one device: stay there if it is fast enough, or
    /// use DDP to share each batch among the devices.
    Ddp,
    /// DDP does not fit; this is the least sharding that does.
    Shard(ShardingStage),
    /// Even fully sharded it does not fit: cut the model itself (tensor or
    /// pipeline parallelism), or shard it over more devices.
    CutTheModel,
}

/// Memory per device for every stage, for one model, device count and
/// device memory.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub parameters: f64,
    pub devices: usize,
    pub device_bytes: f64,
    pub precision: Precision,
    rows: Vec<PlanRow>,
}

/// The plan for `parameters` parameters on `devices` devices of
/// `device_bytes` bytes each, in `precision`.
pub fn plan_memory(
    parameters: f64,
    devices: usize,
    device_bytes: f64,
    precision: Precision,
) -> Result<MemoryPlan, PlanError> {
    if !(parameters.is_finite() && parameters > 0.0 && parameters.fract() == 0.0) {
        return Err(PlanError::Parameters(parameters));
    }
    if devices == 0 {
        return Err(PlanError::NoDevices);
    }
    if !(device_bytes.is_finite() && device_bytes > 0.0) {
        return Err(PlanError::DeviceMemory(device_bytes));
    }
    let rows = ShardingStage::ALL
        .iter()
        .map(|&stage| PlanRow {
            stage,
            bytes_per_parameter: stage.per_device(precision, devices),
            parameters,
            device_bytes,
        })
        .collect();
    Ok(MemoryPlan { parameters, devices, device_bytes, precision, rows })
}

impl MemoryPlan {
    /// One row per stage, from DDP to FSDP.
    pub fn rows(&self) -> &[PlanRow] {
        &self.rows
    }

    /// The row of `stage`.
    pub fn row(&self, stage: ShardingStage) -> &PlanRow {
        self.rows.iter().find(|row| row.stage == stage).expect("a plan has a row for every stage")
    }

    /// The decision guide: DDP if it fits, else the least sharding that
    /// fits, else cut the model.
    pub fn verdict(&self) -> Verdict {
        match self.rows.iter().find(|row| row.fits()).map(|row| row.stage) {
            Some(ShardingStage::Ddp) => Verdict::Ddp,
            Some(stage) => Verdict::Shard(stage),
            None => Verdict::CutTheModel,
        }
    }

    /// The fewest devices of this size on which FSDP's model states fit.
    pub fn devices_for_full_shard(&self) -> usize {
        let total = self.parameters * self.precision.bytes_per_parameter().total();
        (total / self.device_bytes).ceil().max(1.0) as usize
    }

    /// The verdict in words, with the reason.
    pub fn advice(&self) -> String {
        let states = |stage| format_gb(self.row(stage).per_device_bytes());
        match self.verdict() {
            Verdict::Ddp => format!(
                "DDP: the model states fit on one device ({}); stay on one device if it is fast enough, \
                 use DDP on {} devices if not",
                states(ShardingStage::Ddp),
                self.devices
            ),
            Verdict::Shard(stage) => format!(
                "{}: the least sharding that fits ({} per device); DDP needs {}",
                stage.name(),
                states(stage),
                states(ShardingStage::Ddp)
            ),
            Verdict::CutTheModel => format!(
                "tensor or pipeline parallelism: even fully sharded the model states take {} per device; \
                 FSDP alone would need at least {} such devices",
                states(ShardingStage::Fsdp),
                self.devices_for_full_shard()
            ),
        }
    }

    /// The table, one row per stage, in GB (10^9 bytes).
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "| strategy | sharded | parameters | gradients | optimizer state | bytes per parameter | per device \
             | left of {} GiB ({}) | fits |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
            format_bytes(self.device_bytes / GIB),
            format_gb(self.device_bytes)
        );
        for row in &self.rows {
            let b = row.bytes_per_parameter;
            out += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                row.stage.name(),
                row.stage.shards(),
                format_bytes(b.parameters),
                format_bytes(b.gradients),
                format_bytes(b.optimizer_state),
                format_bytes(b.total()),
                format_gb(row.per_device_bytes()),
                format_gb(row.left_bytes()),
                if row.fits() { "yes" } else { "no" }
            );
        }
        out
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ddp => write!(f, "DDP"),
            Verdict::Shard(stage) => write!(f, "{}", stage.name()),
            Verdict::CutTheModel => write!(f, "tensor or pipeline parallelism"),
        }
    }
}

/// Bytes per parameter, with at most two decimals: 4, 0.5, 4.67.
fn format_bytes(bytes: f64) -> String {
    let text = format!("{bytes:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bytes as GB (10^9), one decimal: "38.5 GB".
fn format_gb(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}
