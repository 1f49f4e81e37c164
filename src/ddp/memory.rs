//! The library's own account of the bytes it holds for training, per rank:
//! parameters, gradients and optimizer state. Sharding exists to shrink
//! exactly these three, so each strategy (DDP, ZeRO-1, ZeRO-2, FSDP) tells a
//! [`MemoryLedger`] when it allocates or frees one of its tensors, and the
//! ledger keeps the bytes alive, their peak and the whole timeline. The
//! peak is what a strategy costs; the timeline is what chapter 14's figure
//! draws (gathers rising, frees falling). Activations and libtorch's own
//! workspace are left out: they are the model's, whatever the strategy.
//!
//! ```
//! use ddp_workbook::ddp::{Holding, MemoryLedger};
//! let ledger = MemoryLedger::default();
//! ledger.alloc(Holding::Parameters, 400, "gather block 0");
//! ledger.alloc(Holding::Gradients, 100, "gradient shard of block 0");
//! ledger.free(Holding::Parameters, 400, "free block 0");
//! assert_eq!(ledger.alive().total(), 100);
//! assert_eq!(ledger.peak().total(), 500);
//! ```

use std::sync::{Arc, Mutex};

use tch::Tensor;

/// What a tensor the library holds is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holding {
    Parameters,
    Gradients,
    /// AdamW's two moments.
    OptimizerState,
}

/// Bytes held, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldBytes {
    pub parameters: usize,
    pub gradients: usize,
    pub optimizer_state: usize,
}

impl HeldBytes {
    /// All three together.
    pub fn total(&self) -> usize {
        self.parameters + self.gradients + self.optimizer_state
    }

    fn of(&mut self, what: Holding) -> &mut usize {
        match what {
            Holding::Parameters => &mut self.parameters,
            Holding::Gradients => &mut self.gradients,
            Holding::OptimizerState => &mut self.optimizer_state,
        }
    }
}

/// One allocation or free, and what was alive right after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEvent {
    pub what: Holding,
    /// Positive for an allocation, negative for a free.
    pub delta: i64,
    pub alive: HeldBytes,
    /// What happened, in words ("gather block.0", "free the full gradients").
    pub label: String,
}

#[derive(Default)]
struct Ledger {
    alive: HeldBytes,
    /// Each kind's own peak.
    peak_by_kind: HeldBytes,
    /// Peak of the total, with what was alive at that moment.
    peak: HeldBytes,
    events: Vec<MemoryEvent>,
}

/// The account itself. Clones share one account, so a strategy can hand a
/// clone to its hooks (which run on the backward thread) and the caller
/// reads the same numbers.
#[derive(Clone, Default)]
pub struct MemoryLedger {
    inner: Arc<Mutex<Ledger>>,
}

/// The bytes of a tensor's elements (its shape times its element size).
pub fn tensor_bytes(tensor: &Tensor) -> usize {
    tensor.numel() * tensor.kind().elt_size_in_bytes()
}

impl MemoryLedger {
    /// Records `bytes` more of `what` alive.
    pub fn alloc(&self, what: Holding, bytes: usize, label: &str) {
        self.record(what, bytes as i64, label);
    }

    /// Records `bytes` of `what` freed. Freeing more than is alive is a bug
    /// in the strategy's bookkeeping, and panics saying so.
    pub fn free(&self, what: Holding, bytes: usize, label: &str) {
        self.record(what, -(bytes as i64), label);
    }

    fn record(&self, what: Holding, delta: i64, label: &str) {
        let mut ledger = self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = ledger.alive.of(what);
        let now = *slot as i64 + delta;
        assert!(
            now >= 0,
            "memory ledger: `{label}` frees {} bytes of {what:?} but only {slot} are alive",
            -delta
        );
        *slot = now as usize;
        let alive = ledger.alive;
        let peak = ledger.peak_by_kind.of(what);
        *peak = (*peak).max(now as usize);
        if alive.total() > ledger.peak.total() {
            ledger.peak = alive;
        }
        ledger.events.push(MemoryEvent { what, delta, alive, label: label.to_string() });
    }

    /// What is alive now.
    pub fn alive(&self) -> HeldBytes {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).alive
    }

    /// What was alive at the moment the total peaked (so its three parts
    /// add up to the peak total, unlike the per-kind peaks).
    pub fn peak(&self) -> HeldBytes {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).peak
    }

    /// Each kind's own peak, reached perhaps at different moments.
    pub fn peak_by_kind(&self) -> HeldBytes {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).peak_by_kind
    }

    /// Every allocation and free so far, in order.
    pub fn events(&self) -> Vec<MemoryEvent> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).events.clone()
    }

    /// Starts a new measurement from what is alive now: the peak becomes the
    /// current bytes and the timeline empties (call it before the step to
    /// measure).
    pub fn reset_peak(&self) {
        let mut ledger = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        ledger.peak_by_kind = ledger.alive;
        ledger.peak = ledger.alive;
        ledger.events.clear();
    }
}
