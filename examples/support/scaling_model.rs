//! The model behind `predict_scaling`: chapter 1's α–β ring laid on each
//! strategy's schedule as the library runs it (see that example's header),
//! from one rank's measured compute. Pure arithmetic, so that
//! `tests/scaling_model.rs` can check it against steps worked out by hand.
//! Included with `#[path = "support/scaling_model.rs"] mod scaling_model;`.

/// One rank's compute per step, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Compute {
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    /// Data and what the phases do not cover (logging, the loss's mean).
    pub rest: f64,
}

impl Compute {
    pub fn total(&self) -> f64 {
        self.forward + self.backward + self.optimizer + self.rest
    }

    /// The same step on a device `factor` times faster.
    pub fn faster(&self, factor: f64) -> Compute {
        Compute {
            forward: self.forward / factor,
            backward: self.backward / factor,
            optimizer: self.optimizer / factor,
            rest: self.rest / factor,
        }
    }
}

/// The model's shape, as the schedules see it.
pub struct Shape {
    /// Each parameter's bytes and its stage in backward: 0 the head
    /// (`lm_head`, `ln_f`), 1 + (L-1-k) block k, L+1 the embeddings.
    pub params: Vec<(f64, usize)>,
    /// Each stage's share of forward and backward (by matrix parameters).
    pub stage_share: Vec<f64>,
    /// DDP's buckets in the order they leave: each one's bytes and its
    /// members (indices into `params`).
    pub buckets: Vec<(f64, Vec<usize>)>,
    pub layers: usize,
}

impl Shape {
    pub fn bytes(&self) -> f64 {
        self.params.iter().map(|(b, _)| b).sum()
    }

    /// The bytes of each FSDP unit: the root (head and embeddings), then block 0 .. L-1.
    pub fn unit_bytes(&self) -> Vec<f64> {
        let mut units = vec![0.0; self.layers + 1];
        for &(bytes, stage) in &self.params {
            let unit = if stage == 0 || stage == self.layers + 1 { 0 } else { 1 + (self.layers - stage) };
            units[unit] += bytes;
        }
        units
    }
}

/// The α–β ring on `n` ranks: seconds for each collective of `bytes` (the
/// full tensor: the input of an all-reduce or a reduce-scatter, the output
/// of an all-gather).
#[derive(Clone, Copy)]
pub struct Ring {
    pub n: f64,
    pub alpha: f64,
    pub bytes_per_second: f64,
}

impl Ring {
    pub fn all_reduce(&self, bytes: f64) -> f64 {
        2.0 * self.half(bytes)
    }
    pub fn reduce_scatter(&self, bytes: f64) -> f64 {
        self.half(bytes)
    }
    pub fn all_gather(&self, bytes: f64) -> f64 {
        self.half(bytes)
    }
    /// (N-1) messages of a chunk each.
    fn half(&self, bytes: f64) -> f64 {
        (self.n - 1.0) * (self.alpha + bytes / self.n / self.bytes_per_second)
    }
}

/// One rank's queue of collectives: each starts when it is started and the
/// previous one is done.
#[derive(Default)]
struct Queue {
    free_at: f64,
    busy: f64,
}

impl Queue {
    /// Starts a collective of `seconds` at `t`; returns when it ends.
    fn start(&mut self, t: f64, seconds: f64) -> f64 {
        self.free_at = self.free_at.max(t) + seconds;
        self.busy += seconds;
        self.free_at
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Strategy {
    Ddp,
    Zero1,
    Zero2,
    Fsdp,
}
pub const STRATEGIES: [Strategy; 4] = [Strategy::Ddp, Strategy::Zero1, Strategy::Zero2, Strategy::Fsdp];

impl Strategy {
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ddp => "DDP",
            Strategy::Zero1 => "ZeRO-1",
            Strategy::Zero2 => "ZeRO-2",
            Strategy::Fsdp => "FSDP",
        }
    }
}

/// One prediction: the step, the communication's total time, and the bound.
pub struct Predicted {
    pub step: f64,
    pub communication: f64,
    /// The step if every collective ran under compute.
    pub bound: f64,
}

impl Predicted {
    pub fn hidden_share(&self) -> f64 {
        if self.communication <= 0.0 {
            return 1.0;
        }
        let exposed = (self.step - self.bound).max(0.0);
        (1.0 - exposed / self.communication).clamp(0.0, 1.0)
    }
}

/// The step of `strategy` on `ring`, from one rank's `compute`, with `accum`
/// micro-batches per step (the training run's 2).
pub fn predict(strategy: Strategy, shape: &Shape, compute: Compute, ring: Ring, accum: usize) -> Predicted {
    let k = accum as f64;
    let (forward, backward) = (compute.forward / k, compute.backward / k); // per micro-batch
    let optimizer = match strategy {
        Strategy::Ddp => compute.optimizer,
        _ => compute.optimizer / ring.n, // each rank steps its shard
    };
    let stages = shape.layers + 2;
    let mut queue = Queue::default();
    // The micro-batches before the last: no communication but FSDP's gathers.
    let mut t = compute.rest;
    let step = if strategy == Strategy::Fsdp {
        let units = shape.unit_bytes();
        for micro_batch in 0..accum {
            t = fsdp_micro_batch(
                &mut queue,
                t,
                (forward, backward),
                shape,
                &units,
                ring,
                micro_batch + 1 == accum,
            );
        }
        t + optimizer
    } else {
        t += (k - 1.0) * (forward + backward) + forward;
        // Backward of the last micro-batch: stage s ends at ends[s].
        let mut ends = vec![0.0; stages];
        let mut clock = t;
        for (s, end) in ends.iter_mut().enumerate() {
            clock += backward * shape.stage_share[s];
            *end = clock;
        }
        // Buckets are started in order, each once all its gradients are ready.
        let mut started = t;
        let mut done = t;
        for (bytes, members) in &shape.buckets {
            let ready = members.iter().map(|&i| ends[shape.params[i].1]).fold(t, f64::max);
            started = started.max(ready);
            let bytes = *bytes;
            let seconds =
                if strategy == Strategy::Zero2 { ring.reduce_scatter(bytes) } else { ring.all_reduce(bytes) };
            done = queue.start(started, seconds);
        }
        let mut t = clock.max(done) + optimizer;
        if strategy != Strategy::Ddp {
            // The updated shards, gathered bucket by bucket after the step.
            for (bytes, _) in &shape.buckets {
                t = queue.start(t, ring.all_gather(*bytes));
            }
        }
        t
    };
    let bound = compute.rest + k * (forward + backward) + optimizer;
    Predicted { step, communication: queue.busy, bound }
}

/// One micro-batch of FSDP from `t`: forward (the root gathered, then each
/// block, the next one prefetched), backward (each block gathered again,
/// the next prefetched; in the last micro-batch each unit reduce-scattered
/// after its backward, the previous one waited for there). Returns its end.
fn fsdp_micro_batch(
    queue: &mut Queue,
    mut t: f64,
    (forward, backward): (f64, f64),
    shape: &Shape,
    units: &[f64],
    ring: Ring,
    last: bool,
) -> f64 {
    let layers = shape.layers;
    let block_share = |k: usize| shape.stage_share[1 + (layers - 1 - k)];
    let head = shape.stage_share[0];
    // Forward. The root stays gathered until its backward is done.
    t = queue.start(t, ring.all_gather(units[0]));
    let mut gathered = queue.start(t, ring.all_gather(units[1]));
    for k in 0..layers {
        t = t.max(gathered);
        if k + 1 < layers {
            gathered = queue.start(t, ring.all_gather(units[k + 2]));
        }
        t += forward * block_share(k);
    }
    t += forward * head;
    // Backward.
    t += backward * head;
    let mut gathered = queue.start(t, ring.all_gather(units[layers]));
    let mut reduced = t;
    for k in (0..layers).rev() {
        t = t.max(gathered);
        if k > 0 {
            gathered = queue.start(t, ring.all_gather(units[k]));
        }
        t += backward * block_share(k);
        if last {
            t = t.max(reduced); // one reduce-scatter in flight at most
            reduced = queue.start(t, ring.reduce_scatter(units[k + 1]));
        }
    }
    if last {
        t = t.max(reduced);
        t = queue.start(t, ring.reduce_scatter(units[0]));
    }
    t
}
