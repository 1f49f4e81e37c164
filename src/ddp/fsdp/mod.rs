//! FSDP in the finished library: [`FullyShard`], ZeRO stage 3, PyTorch's
//! FSDP2 `fully_shard` with `FULL_SHARD`. Each rank stores only its shard
//! (dim-0 rows) of every parameter, its shard of every averaged gradient,
//! and the optimizer state of its shard. The model is cut into units, as
//! `fully_shard` is applied: each transformer block of a [`Gpt`] is a unit,
//! the rest (embeddings, `ln_f`, `lm_head`) is the root. Around each unit:
//!
//! - before its forward, one all-gather of its padded shards fills its full
//!   parameters (`FSDPParamGroup.pre_forward`, `foreach_all_gather`), while
//!   the next unit's all-gather already travels (prefetch);
//! - after its forward, the full parameters are freed
//!   (`reshard_after_forward=True`: storage resized to 0 bytes, though
//!   autograd still holds them) or kept (`False`, i.e. `SHARD_GRAD_OP`);
//! - before its backward (a hook on the gradient of its output), they are
//!   gathered again, and the previous unit's all-gather is prefetched;
//! - after its backward (every gradient of it accumulated: grad-ready
//!   hooks, as the Reducer counts them), its gradients are reduce-scattered
//!   (`foreach_reduce`, float64's pre- and post-division), the full ones
//!   and the full parameters freed.
//!
//! | file | what |
//! | --- | --- |
//! | this one | [`FullyShard`]: units, hooks, the communication thread, [`FsdpSgd`], [`FsdpAdamW`] |
//! | `schedule.rs` | [`FsdpSchedule`]: the rows each rank keeps, and what to gather, prefetch, free and reduce-scatter when: the seam chapter 14 swaps |
//! | `unit.rs` | one unit's plumbing: shards, the full storage, copies in and out of the collectives |
//!
//! The collectives run on one communication thread per [`FullyShard`], in
//! the order the schedule issues them, which is the same on every rank; a
//! unit's all-gather can so run while the caller computes another unit.
//! The in-process and MPI backends take calls from any thread; this FSDP
//! is CPU-only (the storage resize of `autograd::resize_storage`).
//!
//! Training a GPT:
//!
//! ```no_run
//! use ddp_workbook::ddp::{FsdpAdamW, FsdpOptions, FullyShard};
//! use ddp_workbook::dist::spawn;
//! use ddp_workbook::models::{Gpt, GptConfig};
//! use ddp_workbook::tch::{Kind, Tensor};
//!
//! spawn(2, |pg| {
//!     let (vs, gpt) = Gpt::seeded(0, &GptConfig::tiny(), Kind::Double); // the same seed on every rank
//!     let fsdp = FullyShard::gpt(&gpt, &vs, pg, FsdpOptions::default())?; // each rank keeps its shards
//!     let mut adamw = FsdpAdamW::new(&fsdp, 1e-3, 0.01);
//!     let tokens = Tensor::zeros([2, 8], (Kind::Int64, vs.device()));
//!     for _ in 0..3 {
//!         let logits = fsdp.forward_with(|hooks| gpt.forward_with_hooks(&tokens, hooks))?;
//!         let loss = logits.view([-1, 16]).cross_entropy_for_logits(&tokens.view([-1]));
//!         fsdp.backward(&loss)?; // gradient shards, averaged over the ranks
//!         adamw.step(&fsdp)?;
//!         fsdp.zero_grad();
//!     }
//!     let _full = fsdp.full_parameters()?; // a collective: every rank gets every parameter
//!     Ok(())
//! })
//! .unwrap();
//! ```

pub mod schedule;
mod unit;

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

use tch::nn::VarStore;
use tch::Tensor;

pub use schedule::{divide_factors, shard_rows, Action, FsdpSchedule, UnitAt};
use unit::Unit;

use crate::autograd::{register_grad_hook, GradReadyHooks};
use crate::ddp::adamw_update::AdamWUpdate;
use crate::ddp::memory::{Holding, MemoryLedger};
use crate::dist::{tagged, DistError, Group, ReduceOp};
use crate::models::{named_parameters, Gpt, LayerHooks, Mlp, Named};

/// How to shard (the arguments of `fully_shard`).
#[derive(Clone)]
pub struct FsdpOptions {
    /// Free each unit's full parameters after its forward (`FULL_SHARD`),
    /// or keep them until after its backward (`SHARD_GRAD_OP`).
    pub reshard_after_forward: bool,
    /// Where the gathers, frees, gradient shards and moments are counted.
    pub ledger: MemoryLedger,
    /// Whose decisions run: the library's, or chapter 14's.
    pub schedule: FsdpSchedule,
    /// Keep every [`FsdpEvent`] for [`FullyShard::take_events`] (off by
    /// default: a long run would pile them up).
    pub record_events: bool,
}

impl Default for FsdpOptions {
    fn default() -> Self {
        FsdpOptions {
            reshard_after_forward: true,
            ledger: MemoryLedger::default(),
            schedule: FsdpSchedule::default(),
            record_events: false,
        }
    }
}

/// What happened, in order, as the caller's thread, the backward thread
/// and the communication thread saw it. Tests read it to prove prefetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsdpEvent {
    PreForward(usize),
    PostForward(usize),
    PreBackward(usize),
    PostBackward(usize),
    /// An all-gather handed to the communication thread.
    GatherIssued(usize),
    /// The communication thread finished it.
    GatherDone(usize),
    /// Its result copied into the full parameters.
    Gathered(usize),
    Freed(usize),
    ReduceScatterIssued(usize),
    ReduceScatterDone(usize),
}

type Job = Box<dyn FnOnce() + Send>;

/// The event list, shared with the communication thread; `None` when the
/// options do not record events.
#[derive(Clone)]
struct Events(Option<Arc<Mutex<Vec<FsdpEvent>>>>);

impl Events {
    fn push(&self, event: FsdpEvent) {
        if let Some(list) = &self.0 {
            list.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        }
    }

    fn take(&self) -> Vec<FsdpEvent> {
        self.0
            .as_ref()
            .map_or(vec![], |list| std::mem::take(&mut *list.lock().unwrap_or_else(|p| p.into_inner())))
    }
}

/// One thread that runs this FSDP's collectives, one at a time, in the
/// order they were handed to it (so in the same order on every rank).
struct CommThread {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl CommThread {
    fn start(rank: usize) -> CommThread {
        let (jobs, inbox) = channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("fsdp-comm-{rank}"))
            .spawn(move || {
                for job in inbox {
                    job();
                }
            })
            .expect("the OS starts a thread");
        CommThread { jobs: Some(jobs), thread: Some(thread) }
    }

    fn submit<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Receiver<T> {
        let (done, result) = channel();
        let job: Job = Box::new(move || _ = done.send(work()));
        self.jobs.as_ref().expect("running").send(job).expect("the communication thread runs until drop");
        result
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        drop(self.jobs.take()); // ends its loop once the queue is empty
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where a collective's result arrives from the communication thread.
type Pending<T> = Receiver<Result<T, DistError>>;

/// One issued reduce-scatter.
struct InFlight {
    unit: usize,
    /// The bytes of its input the ledger counts as alive: 0 once the next
    /// unit's post-backward (or the end of backward) waited for it.
    input_bytes: usize,
    /// The unit's parameters that have a gradient in it.
    with_grad: Vec<usize>,
    result: Pending<Tensor>,
    /// The result, once something waited for it before backward's end.
    received: Option<Result<Tensor, DistError>>,
}

/// What the caller, the forward hooks and the backward hooks share.
struct Driver {
    pg: Group,
    units: Vec<Unit>,
    /// Flat parameter index (as hooked) to (unit, index in unit).
    place: Vec<(usize, usize)>,
    gathers: HashMap<usize, Pending<Vec<Tensor>>>,
    /// Issued reduce-scatters, oldest first, until backward takes their
    /// results.
    reduce_scatters: VecDeque<InFlight>,
    /// Per unit: gradients accumulated in this backward, and whether its
    /// post-backward ran.
    ready: Vec<usize>,
    backward_done: Vec<bool>,
    reshard_after_forward: bool,
    requires_gradient_sync: bool,
    schedule: FsdpSchedule,
    ledger: MemoryLedger,
    events: Events,
    /// The first failure in a hook, reported by the next call of the caller.
    error: Option<DistError>,
    /// Per unit, the bytes of all-gather output alive for it.
    gather_buffers: Vec<usize>,
    comm: CommThread,
}

fn lock(driver: &Mutex<Driver>) -> MutexGuard<'_, Driver> {
    driver.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    fn log(&self, event: FsdpEvent) {
        self.events.push(event);
    }

    fn at(&self, unit: usize) -> UnitAt {
        UnitAt {
            unit,
            units: self.units.len(),
            reshard_after_forward: self.reshard_after_forward,
            requires_gradient_sync: self.requires_gradient_sync,
        }
    }

    /// Runs `actions`; the first failure is kept (and the rest skipped).
    fn run(&mut self, actions: Vec<Action>) {
        for action in actions {
            if self.error.is_some() {
                return;
            }
            if let Err(error) = self.act(action) {
                self.error = Some(error);
            }
        }
    }

    fn act(&mut self, action: Action) -> Result<(), DistError> {
        match action {
            Action::Prefetch(u) => self.issue_gather(u),
            Action::Gather(u) => self.gather(u),
            Action::Free(u) => {
                if u < self.units.len() && self.units[u].gathered {
                    self.units[u].free(self.pg.as_ref(), &self.ledger)?;
                    self.log(FsdpEvent::Freed(u));
                }
                Ok(())
            }
            Action::ReduceScatter(u) => self.reduce_scatter(u),
        }
    }

    fn issue_gather(&mut self, u: usize) -> Result<(), DistError> {
        if u >= self.units.len() || self.units[u].gathered || self.gathers.contains_key(&u) {
            return Ok(());
        }
        let unit = &self.units[u];
        let input = unit.all_gather_input(self.pg.as_ref())?;
        let bytes = input.numel() * unit.kind.elt_size_in_bytes() * self.pg.world_size();
        self.ledger.alloc(Holding::Parameters, bytes, &format!("all-gather output of {}", unit.name));
        self.gather_buffers[u] += bytes;
        let (pg, events, tag) =
            (self.pg.clone(), self.events.clone(), format!("fsdp all-gather of {}", unit.name));
        let empty = input.numel() == 0;
        let result = self.comm.submit(move || {
            let gathered = if empty { Ok(vec![]) } else { tagged(tag, || pg.all_gather(&input)) };
            events.push(FsdpEvent::GatherDone(u));
            gathered
        });
        self.gathers.insert(u, result);
        self.log(FsdpEvent::GatherIssued(u));
        Ok(())
    }

    fn gather(&mut self, u: usize) -> Result<(), DistError> {
        if u >= self.units.len() || self.units[u].gathered {
            return Ok(());
        }
        self.issue_gather(u)?;
        let pending = self.gathers.remove(&u).expect("issued above");
        let waited = pending.recv().unwrap_or_else(|_| Err(self.stopped("all-gather")));
        let result = waited.and_then(|gathered| {
            let (pg, ledger) = (self.pg.clone(), self.ledger.clone());
            self.units[u].copy_out(pg.as_ref(), &gathered, &ledger)
        });
        self.ledger.free(
            Holding::Parameters,
            std::mem::take(&mut self.gather_buffers[u]),
            "all-gather output copied out",
        );
        if let Err(error) = result {
            // The unit's compute runs anyway (in a backward hook it cannot
            // be stopped): give it memory to read, not values.
            self.units[u].fill_after_failure();
            return Err(error);
        }
        self.log(FsdpEvent::Gathered(u));
        Ok(())
    }

    fn stopped(&self, what: &str) -> DistError {
        DistError::Invalid {
            rank: self.pg.rank(),
            op: what.into(),
            detail: "FSDP's communication thread stopped before it answered".into(),
        }
    }

    /// Waits for the last issued reduce-scatter and counts its input as
    /// freed. FSDP2 does this at the start of the next unit's post-backward
    /// reduce (`FSDPParamGroup.post_backward`: the compute stream waits for
    /// the previous `reduce_scatter_state`'s event and drops its input), so
    /// one input at most is in flight while the next unit's gradients
    /// accumulate; the ledger then counts what is really alive.
    fn wait_for_previous_reduce_scatter(&mut self) {
        let stopped = self.stopped("reduce-scatter");
        let Some(last) = self.reduce_scatters.back_mut() else { return };
        if last.received.is_none() {
            last.received = Some(last.result.recv().unwrap_or_else(|_| Err(stopped)));
        }
        if last.input_bytes > 0 {
            let label = format!("reduce-scatter input of {} done", self.units[last.unit].name);
            self.ledger.free(Holding::Gradients, last.input_bytes, &label);
            last.input_bytes = 0;
        }
    }

    fn reduce_scatter(&mut self, u: usize) -> Result<(), DistError> {
        self.wait_for_previous_reduce_scatter();
        let (pre, _) = (self.schedule.divide_factors)(self.pg.world_size());
        let (pg, ledger) = (self.pg.clone(), self.ledger.clone());
        let unit = &mut self.units[u];
        let (input, with_grad) = unit.reduce_scatter_input(pg.as_ref(), pre, &ledger)?;
        let bytes = crate::ddp::memory::tensor_bytes(&input);
        ledger.alloc(Holding::Gradients, bytes, &format!("reduce-scatter input of {}", unit.name));
        // Only the parameters with a gradient are in it (FSDP2's rule): a
        // rank whose set differs calls it with another length, and the
        // error should say which set, and what to do.
        let tag = format!(
            "fsdp reduce-scatter of {} ({} of its {} parameters have a gradient on this rank: every rank must \
             use the same parameters in a step: add 0 * p.sum() to the loss for one a rank skips)",
            unit.name,
            with_grad.len(),
            unit.params.len()
        );
        let events = self.events.clone();
        let result = self.comm.submit(move || {
            let output = if input.numel() == 0 {
                Ok(input)
            } else {
                tagged(tag, || pg.reduce_scatter(&input, ReduceOp::Sum))
            };
            events.push(FsdpEvent::ReduceScatterDone(u));
            output
        });
        self.reduce_scatters.push_back(InFlight {
            unit: u,
            input_bytes: bytes,
            with_grad,
            result,
            received: None,
        });
        self.log(FsdpEvent::ReduceScatterIssued(u));
        Ok(())
    }

    /// A parameter's gradient was accumulated (backward thread).
    fn gradient_ready(&mut self, index: usize) {
        let (u, j) = self.place[index];
        let param = &mut self.units[u].params[j];
        if !param.grad_counted {
            param.grad_counted = true;
            let label = format!("gradient of {}", param.name);
            self.ledger.alloc(Holding::Gradients, param.full_bytes(), &label);
        }
        self.ready[u] += 1;
        if self.ready[u] == self.units[u].params.len() && !self.backward_done[u] {
            self.post_backward(u);
        }
    }

    fn post_backward(&mut self, u: usize) {
        self.backward_done[u] = true;
        self.log(FsdpEvent::PostBackward(u));
        let actions = (self.schedule.post_backward)(self.at(u));
        self.run(actions);
    }

    /// After `loss.backward()` returned: the units whose backward did not
    /// complete (a parameter got no gradient: it is left out), then every
    /// reduce-scatter's result, then whatever is still gathered is freed.
    fn finish_backward(&mut self) -> Result<(), DistError> {
        for u in 0..self.units.len() {
            if !self.backward_done[u] {
                self.post_backward(u);
            }
        }
        let (_, post) = (self.schedule.divide_factors)(self.pg.world_size());
        while let Some(InFlight { unit: u, input_bytes, with_grad, result, received }) =
            self.reduce_scatters.pop_front()
        {
            let output = received
                .unwrap_or_else(|| result.recv().unwrap_or_else(|_| Err(self.stopped("reduce-scatter"))));
            if input_bytes > 0 {
                self.ledger.free(Holding::Gradients, input_bytes, "reduce-scatter input done");
            }
            match output {
                Ok(output) if self.error.is_none() => {
                    let (pg, ledger) = (self.pg.clone(), self.ledger.clone());
                    if let Err(error) =
                        self.units[u].take_reduced(pg.as_ref(), output, &with_grad, post, &ledger)
                    {
                        self.error = Some(error);
                    }
                }
                Ok(_) => {}
                Err(error) => _ = self.error.get_or_insert(error),
            }
        }
        self.drain_gathers();
        for u in 0..self.units.len() {
            self.run(vec![Action::Free(u)]);
        }
        self.ready.iter_mut().for_each(|r| *r = 0);
        self.backward_done.iter_mut().for_each(|d| *d = false);
        self.take_error()
    }

    /// Waits for prefetched all-gathers nobody used (their result goes).
    fn drain_gathers(&mut self) {
        let mut pending: Vec<usize> = self.gathers.keys().copied().collect();
        pending.sort_unstable();
        for u in pending {
            if let Some(result) = self.gathers.remove(&u) {
                if let Ok(Err(error)) = result.recv() {
                    self.error.get_or_insert(error);
                }
                self.ledger.free(
                    Holding::Parameters,
                    std::mem::take(&mut self.gather_buffers[u]),
                    "unused prefetch",
                );
            }
        }
    }

    fn take_error(&mut self) -> Result<(), DistError> {
        self.error.take().map_or(Ok(()), Err)
    }
}

/// A model sharded with FSDP (ZeRO-3): PyTorch's `fully_shard` applied to
/// each unit and the root. Build it with [`FullyShard::gpt`],
/// [`FullyShard::mlp`] or, for any model, [`FullyShard::new`]; run each
/// forward through [`forward_with`](Self::forward_with) and each backward
/// through [`backward`](Self::backward); step with [`FsdpSgd`] or
/// [`FsdpAdamW`].
pub struct FullyShard {
    driver: Arc<Mutex<Driver>>,
    events: Events,
    ledger: MemoryLedger,
    /// Whether the model's layers are units 1, 2, ... (else the layer
    /// hooks do nothing: the root is the only unit).
    layer_units: bool,
    _hooks: GradReadyHooks,
}

impl FullyShard {
    /// Shards `params` in units: `units[0]` is the root, `units[k]` lists
    /// the indices into `params` of unit k, named by the first element.
    /// Every parameter must be in exactly one unit, require grad, and be
    /// the same on every rank (build every rank from one seed); every rank
    /// calls it with the same lists. Each rank keeps its rows
    /// ([`shard_rows`]) and frees the full parameters.
    pub fn new(
        params: &[Named],
        units: Vec<(String, Vec<usize>)>,
        pg: Group,
        options: FsdpOptions,
    ) -> Result<FullyShard, DistError> {
        let invalid =
            |detail: String| DistError::Invalid { rank: pg.rank(), op: "fully_shard".into(), detail };
        let mut seen = vec![false; params.len()];
        for (name, members) in &units {
            for &i in members {
                if i >= params.len() || std::mem::replace(&mut seen[i], true) {
                    return Err(invalid(format!(
                        "unit `{name}` lists parameter {i}, which is out of range or in another unit already"
                    )));
                }
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(invalid(format!(
                "parameter `{}` is in no unit: put it in the root (units[0])",
                params[i].0
            )));
        }
        if let Some((name, _)) = params.iter().find(|(_, p)| !p.requires_grad()) {
            return Err(invalid(format!(
                "parameter `{name}` does not require grad: this FSDP shards trainable parameters only; keep a frozen one out of `params`"
            )));
        }
        let ledger = options.ledger.clone();
        let mut built = vec![];
        let mut place = vec![(0, 0); params.len()];
        let mut hooked = vec![];
        for (u, (name, members)) in units.into_iter().enumerate() {
            let mut own = vec![];
            for (j, &i) in members.iter().enumerate() {
                place[hooked.len()] = (u, j);
                hooked.push(params[i].1.shallow_clone());
                own.push((params[i].0.clone(), params[i].1.shallow_clone()));
            }
            built.push(Unit::new(pg.as_ref(), name, own, options.schedule.shard_rows, &ledger)?);
        }
        let count = built.len();
        let events = Events(options.record_events.then(Arc::default));
        let driver = Arc::new(Mutex::new(Driver {
            comm: CommThread::start(pg.rank()),
            pg: pg.clone(),
            units: built,
            place,
            gathers: HashMap::new(),
            reduce_scatters: VecDeque::new(),
            ready: vec![0; count],
            backward_done: vec![false; count],
            reshard_after_forward: options.reshard_after_forward,
            requires_gradient_sync: true,
            schedule: options.schedule,
            ledger: ledger.clone(),
            events: events.clone(),
            error: None,
            gather_buffers: vec![0; count],
        }));
        let weak: Weak<Mutex<Driver>> = Arc::downgrade(&driver);
        let hooks = GradReadyHooks::register(&hooked, move |i| {
            if let Some(driver) = weak.upgrade() {
                lock(&driver).gradient_ready(i);
            }
        })
        .map_err(|e| invalid(e.to_string()))?;
        Ok(FullyShard { driver, events, ledger, layer_units: count > 1, _hooks: hooks })
    }

    /// The units of `fully_shard` applied to each of `layers` layers and
    /// then to the model: unit 0 is the root (every parameter outside the
    /// layers), unit k + 1 holds the parameters named `{prefix}.{k}.*`.
    /// Each unit is its name and the indices of its parameters in `params`.
    /// Pure, so that a model of the schedule (predict_scaling) cuts the
    /// model as the library does.
    pub fn units_per_layer(params: &[Named], prefix: &str, layers: usize) -> Vec<(String, Vec<usize>)> {
        let mut units: Vec<(String, Vec<usize>)> = vec![("root".into(), vec![])];
        units.extend((0..layers).map(|k| (format!("{prefix}.{k}"), vec![])));
        for (i, (name, _)) in params.iter().enumerate() {
            let layer = name
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('.'))
                .and_then(|rest| rest.split('.').next())
                .and_then(|k| k.parse::<usize>().ok());
            let unit = layer.map_or(0, |k| k + 1);
            assert!(unit <= layers, "parameter {name} names layer {} of a model of {layers}", unit - 1);
            units[unit].1.push(i);
        }
        units
    }

    /// `fully_shard` on each transformer block, then on the GPT: unit k is
    /// block k-1 (`blocks.{k-1}.*`), the root holds the embeddings, `ln_f`
    /// and `lm_head`.
    pub fn gpt(gpt: &Gpt, vs: &VarStore, pg: Group, options: FsdpOptions) -> Result<FullyShard, DistError> {
        let params = named_parameters(vs);
        let units = Self::units_per_layer(&params, "blocks", gpt.config().n_layer as usize);
        Self::new(&params, units, pg, options)
    }

    /// `fully_shard` on the MLP (the root only), or, with `per_layer`, on
    /// each linear layer first (unit k is `layers.{k-1}.*`).
    pub fn mlp(
        mlp: &Mlp,
        vs: &VarStore,
        pg: Group,
        options: FsdpOptions,
        per_layer: bool,
    ) -> Result<FullyShard, DistError> {
        let params = named_parameters(vs);
        let units = if per_layer {
            Self::units_per_layer(&params, "layers", mlp.num_layers())
        } else {
            vec![("root".into(), (0..params.len()).collect())]
        };
        Self::new(&params, units, pg, options)
    }

    fn driver(&self) -> MutexGuard<'_, Driver> {
        lock(&self.driver)
    }

    /// Runs one forward pass: the root's pre-forward (gather), then `model`
    /// with the unit hooks (pass them to the model's `forward_with_hooks`),
    /// then the root's post-forward.
    ///
    /// The model must run the hooks around each of its units
    /// (`Gpt::forward_with_hooks`): a unit computed without them would read
    /// freed parameters. A unit whose hooks did not run is an error here.
    pub fn forward_with(&self, model: impl FnOnce(&dyn LayerHooks) -> Tensor) -> Result<Tensor, DistError> {
        let units = self.driver().units.len();
        let hooks = UnitHooks { fsdp: self, seen: std::cell::RefCell::new(vec![false; units]) };
        hooks.around(0, true);
        self.driver().take_error()?;
        let output = model(&hooks);
        hooks.around(0, false);
        let mut driver = self.driver();
        driver.take_error()?;
        let missed: Vec<usize> =
            (1..units).filter(|&u| self.layer_units && !hooks.seen.borrow()[u]).collect();
        if !missed.is_empty() {
            let detail = format!(
                "the forward ran no hooks for units {missed:?} (layers {:?}): run the model with \
                 `forward_with_hooks(input, hooks)` and the hooks `forward_with` passes",
                missed.iter().map(|u| u - 1).collect::<Vec<_>>()
            );
            return Err(DistError::Invalid { rank: driver.pg.rank(), op: "FSDP forward".into(), detail });
        }
        Ok(output)
    }

    /// `loss.backward()`, then the end of FSDP's backward: the reduce-
    /// scatters' results into the gradient shards, and every unit freed.
    pub fn backward(&self, loss: &Tensor) -> Result<(), DistError> {
        loss.f_backward().map_err(|cause| DistError::Torch {
            rank: self.driver().pg.rank(),
            op: "backward".into(),
            cause,
        })?;
        self.driver().finish_backward()
    }

    /// `set_requires_gradient_sync`: false for the micro-batches of an
    /// accumulation but the last (FSDP2's `no_sync`). Meanwhile each
    /// unit's full gradients stay alive between micro-batches (that is what
    /// FSDP must keep), the parameters are still freed after each backward,
    /// and the last micro-batch's backward reduce-scatters the sum.
    pub fn set_requires_gradient_sync(&self, sync: bool) {
        self.driver().requires_gradient_sync = sync;
    }

    /// Frees the gradient shards (`optimizer.zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        let mut driver = self.driver();
        let ledger = driver.ledger.clone();
        for unit in &mut driver.units {
            for p in &mut unit.params {
                if let Some(g) = p.grad_shard.take() {
                    ledger.free(Holding::Gradients, tensor_bytes_of(&g), &format!("zero_grad {}", p.name));
                }
            }
        }
    }

    /// This rank's shards, in the order of the units: name, the rows this
    /// rank owns (a view: stepping it in place steps the shard) and their
    /// averaged gradient, if there is one.
    pub fn sharded_parameters(&self) -> Vec<ShardedParameter> {
        let driver = self.driver();
        let mut out = vec![];
        for unit in &driver.units {
            for p in &unit.params {
                out.push(ShardedParameter {
                    name: p.name.clone(),
                    rows: p.own,
                    shard: p.shard(),
                    grad: p.grad(),
                });
            }
        }
        out
    }

    /// Every full parameter, gathered (a collective: every rank calls it),
    /// as fresh tensors in the order of [`sharded_parameters`](Self::sharded_parameters).
    /// For checks and checkpoints; the model's own tensors stay freed.
    pub fn full_parameters(&self) -> Result<Vec<Named>, DistError> {
        let driver = self.driver();
        let pg = driver.pg.clone();
        let mut out = vec![];
        for unit in &driver.units {
            let input = unit.all_gather_input(pg.as_ref())?;
            let tag = format!("fsdp full parameters of {}", unit.name);
            let gathered = if input.numel() == 0 {
                vec![]
            } else {
                let (pg, input) = (pg.clone(), input);
                driver
                    .comm
                    .submit(move || tagged(tag, || pg.all_gather(&input)))
                    .recv()
                    .unwrap_or_else(|_| Err(driver.stopped("all-gather")))?
            };
            let mut offset = 0;
            for p in &unit.params {
                let full = Tensor::zeros(p.full.size(), (p.full.kind(), p.full.device()));
                p.copy_rows(&gathered, offset, &full.view([-1])).map_err(|cause| DistError::Torch {
                    rank: pg.rank(),
                    op: "assembling a full parameter".into(),
                    cause,
                })?;
                offset += p.padded_numel();
                out.push((p.name.clone(), full));
            }
        }
        Ok(out)
    }

    /// Every event since the last call, in order (the call empties the
    /// list); none unless [`FsdpOptions::record_events`] is on.
    pub fn take_events(&self) -> Vec<FsdpEvent> {
        self.events.take()
    }

    /// The ledger this FSDP reports to.
    pub fn ledger(&self) -> &MemoryLedger {
        &self.ledger
    }

    /// Each unit's name and its parameters' names, root first.
    pub fn units(&self) -> Vec<(String, Vec<String>)> {
        let driver = self.driver();
        driver
            .units
            .iter()
            .map(|u| (u.name.clone(), u.params.iter().map(|p| p.name.clone()).collect()))
            .collect()
    }
}

fn tensor_bytes_of(t: &Tensor) -> usize {
    crate::ddp::memory::tensor_bytes(t)
}

/// One parameter as this rank holds it.
pub struct ShardedParameter {
    pub name: String,
    /// `(first row, rows)` of the full parameter that this rank keeps.
    pub rows: (i64, i64),
    /// Those rows, flat (a view into the stored shard).
    pub shard: Tensor,
    /// Their averaged gradient, flat, after a synced backward.
    pub grad: Option<Tensor>,
}

/// The forward hooks: layer `i` is unit `i + 1`.
struct UnitHooks<'a> {
    fsdp: &'a FullyShard,
    /// Which units' pre-forward ran in this forward.
    seen: std::cell::RefCell<Vec<bool>>,
}

impl UnitHooks<'_> {
    fn around(&self, unit: usize, before: bool) {
        let mut driver = self.fsdp.driver();
        if before {
            driver.log(FsdpEvent::PreForward(unit));
            let actions = (driver.schedule.pre_forward)(driver.at(unit));
            driver.run(actions);
            if driver.error.is_some() {
                // The model would read empty storage: stop this rank here.
                let error = driver.error.take().expect("checked");
                drop(driver);
                panic!("FSDP could not gather unit {unit} before its forward: {error}");
            }
        } else {
            driver.log(FsdpEvent::PostForward(unit));
            let actions = (driver.schedule.post_forward)(driver.at(unit));
            driver.run(actions);
        }
    }
}

impl LayerHooks for UnitHooks<'_> {
    fn pre_forward(&self, index: usize) {
        if self.fsdp.layer_units {
            if let Some(seen) = self.seen.borrow_mut().get_mut(index + 1) {
                *seen = true;
            }
            self.around(index + 1, true);
        }
    }

    fn post_forward(&self, index: usize, output: &Tensor) {
        if !self.fsdp.layer_units {
            return;
        }
        let unit = index + 1;
        self.around(unit, false);
        if output.requires_grad() {
            let weak = Arc::downgrade(&self.fsdp.driver);
            let hooked = register_grad_hook(output, move || {
                if let Some(driver) = weak.upgrade() {
                    let mut driver = lock(&driver);
                    driver.log(FsdpEvent::PreBackward(unit));
                    let actions = (driver.schedule.pre_backward)(driver.at(unit));
                    driver.run(actions);
                }
            });
            if let Err(error) = hooked {
                let mut driver = self.fsdp.driver();
                let rank = driver.pg.rank();
                driver.error.get_or_insert(DistError::Invalid {
                    rank,
                    op: "fully_shard".into(),
                    detail: format!("the pre-backward hook of unit {unit}: {error}"),
                });
            }
        }
    }
}

/// SGD on the shards: `p -= lr * g`, elementwise, so each rank's rows get
/// the bits the full parameter would.
pub struct FsdpSgd {
    pub lr: f64,
}

impl FsdpSgd {
    /// The update of one tensor (also what a reference on full tensors runs).
    pub fn update(&self, p: &Tensor, g: &Tensor) -> Result<(), tch::TchError> {
        tch::no_grad(|| p.shallow_clone().f_sub_(&(g * self.lr)).map(|_| ()))
    }

    /// Steps every shard that has a gradient.
    pub fn step(&self, fsdp: &FullyShard) -> Result<(), DistError> {
        for p in fsdp.sharded_parameters() {
            if let Some(g) = &p.grad {
                self.update(&p.shard, g).map_err(|cause| DistError::Torch {
                    rank: fsdp.driver().pg.rank(),
                    op: format!("SGD on the shard of {}", p.name),
                    cause,
                })?;
            }
        }
        Ok(())
    }
}

/// AdamW on the shards ([`AdamWUpdate`], per-parameter step counts): each
/// rank keeps the moments of its rows only, 1/N of plain AdamW's. A
/// parameter that no rank used in a step has no gradient shard (as under
/// FSDP2, whose `.grad` is then None): AdamW skips it, its moments and its
/// step count stay, as one process's AdamW does.
pub struct FsdpAdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    moments: Vec<(Tensor, Tensor)>,
    steps: Vec<i64>,
}

impl FsdpAdamW {
    /// Zero moments for this rank's rows (counted in `fsdp`'s ledger);
    /// PyTorch's betas and eps.
    pub fn new(fsdp: &FullyShard, lr: f64, weight_decay: f64) -> FsdpAdamW {
        let shards = fsdp.sharded_parameters();
        let moments: Vec<(Tensor, Tensor)> =
            shards.iter().map(|p| (p.shard.zeros_like(), p.shard.zeros_like())).collect();
        for ((m, v), p) in moments.iter().zip(&shards) {
            let bytes = tensor_bytes_of(m) + tensor_bytes_of(v);
            fsdp.ledger.alloc(Holding::OptimizerState, bytes, &format!("AdamW moments of {}", p.name));
        }
        FsdpAdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            steps: vec![0; shards.len()],
            moments,
        }
    }

    /// Steps every shard that has a gradient; its step count goes up by one.
    pub fn step(&mut self, fsdp: &FullyShard) -> Result<(), DistError> {
        for (i, p) in fsdp.sharded_parameters().into_iter().enumerate() {
            let Some(g) = &p.grad else { continue };
            self.steps[i] += 1;
            let update = AdamWUpdate {
                lr: self.lr,
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                weight_decay: self.weight_decay,
                step: self.steps[i],
            };
            let (m, v) = &mut self.moments[i];
            let mut shard = p.shard;
            update.apply(&mut shard, g, m, v).map_err(|cause| DistError::Torch {
                rank: fsdp.driver().pg.rank(),
                op: format!("AdamW on the shard of {}", p.name),
                cause,
            })?;
        }
        Ok(())
    }

    /// This rank's state, in the order of [`FullyShard::sharded_parameters`]:
    /// per parameter its step count and the moments of its rows, flat
    /// (handles on the state itself: what a sharded checkpoint saves).
    pub fn shard_state(&self) -> Vec<(i64, Tensor, Tensor)> {
        let each = self.steps.iter().zip(&self.moments);
        each.map(|(&step, (m, v))| (step, m.shallow_clone(), v.shallow_clone())).collect()
    }

    /// Restores [`shard_state`](Self::shard_state)'s step counts; the
    /// moments are restored by copying into the tensors it returns.
    pub fn set_steps(&mut self, steps: &[i64]) {
        self.steps.iter_mut().zip(steps).for_each(|(mine, &saved)| *mine = saved);
    }
}
