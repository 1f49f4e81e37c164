//! The in-process backend's [`ProcessGroup`]: every rank is a thread of this
//! process and the ranks meet in a shared [`World`]. Create one with
//! [`spawn`](super::spawn).
//!
//! Try it: `cargo test --test dist`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tch::Tensor;

use super::comm_thread::CommThread;
use super::link::sleep_until;
use super::world::World;
use crate::dist::call::{group_list_problem, Call, Op};
use crate::dist::completion::Completion;
use crate::dist::{is_float, CommStats, DistError, Group, ProcessGroup, ReduceOp, Work};

/// One rank's handle on an in-process group (the whole world that `spawn`
/// made, or a sub-group made with `new_group`). Each handle counts its own
/// calls in [`CommStats`].
pub struct LocalProcessGroup {
    rank: usize,
    world: Arc<World>,
    /// Where asynchronous all-reduces progress; started at the first one.
    comm: OnceLock<Result<CommThread, String>>,
    /// How many collectives this rank has started: the next call's number.
    next_seq: AtomicU64,
    stats: Mutex<CommStats>,
}

impl LocalProcessGroup {
    pub(super) fn new(rank: usize, world: Arc<World>) -> Self {
        LocalProcessGroup {
            rank,
            world,
            comm: OnceLock::new(),
            next_seq: AtomicU64::new(0),
            stats: Mutex::default(),
        }
    }

    fn count(&self, update: impl FnOnce(&mut CommStats)) {
        update(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// This rank's number in the world `spawn` made: what errors name.
    fn global_rank(&self) -> usize {
        self.world.global[self.rank]
    }

    fn invalid(&self, op: &str, detail: impl Into<String>) -> DistError {
        DistError::Invalid { rank: self.global_rank(), op: op.to_string(), detail: detail.into() }
    }

    /// Rejects tensors no rank could sensibly exchange, before any peer waits.
    fn check_tensor(&self, op: &str, tensor: &Tensor) -> Result<(), DistError> {
        if !tensor.defined() {
            return Err(self.invalid(op, "the tensor is undefined (a gradient that was never computed?)"));
        }
        Ok(())
    }

    fn check_rank(&self, op: &str, what: &str, peer: usize) -> Result<(), DistError> {
        if peer >= self.world.size {
            let size = self.world.size;
            return Err(self.invalid(op, format!("{what} {peer} is not a rank of a group of {size}")));
        }
        Ok(())
    }

    /// Checks an all-reduce, counts it and joins it: its number and name.
    #[track_caller]
    fn begin_all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<(u64, String), DistError> {
        self.check_tensor("all_reduce", tensor)?;
        if op == ReduceOp::Avg && !is_float(tensor.kind()) {
            let kind = tensor.kind();
            return Err(
                self.invalid("all_reduce", format!("avg needs a floating-point tensor, got {kind:?}"))
            );
        }
        self.count(|s| {
            s.all_reduce += 1;
            s.collective_bytes += bytes(tensor);
            s.all_reduce_bytes += bytes(tensor);
        });
        Ok(self.start(Op::AllReduce(op), Some(tensor), Some(tensor.shallow_clone())))
    }

    /// Checks a reduce-scatter, counts it and joins it: its number and name.
    #[track_caller]
    fn begin_reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<(u64, String), DistError> {
        self.check_tensor("reduce_scatter", tensor)?;
        let size = self.world.size as i64;
        let rows = tensor.size().first().copied().unwrap_or(0);
        if tensor.dim() == 0 || rows % size != 0 {
            let shape = tensor.size();
            let detail = format!("dimension 0 of a {shape:?} tensor does not split into {size} equal chunks");
            return Err(self.invalid("reduce_scatter", detail));
        }
        if op == ReduceOp::Avg && !is_float(tensor.kind()) {
            let kind = tensor.kind();
            return Err(
                self.invalid("reduce_scatter", format!("avg needs a floating-point tensor, got {kind:?}"))
            );
        }
        self.count(|s| {
            s.reduce_scatter += 1;
            s.collective_bytes += bytes(tensor);
            s.reduce_scatter_bytes += bytes(tensor);
        });
        Ok(self.start(Op::ReduceScatter(op), Some(tensor), Some(tensor.shallow_clone())))
    }

    /// How long an all-reduce of `tensor` takes on the simulated link, if any.
    fn link_time(&self, tensor: &Tensor) -> Option<Duration> {
        self.world.link.map(|link| link.all_reduce_time(bytes(tensor), self.world.size))
    }

    /// Joins the next collective and returns its number and its name for
    /// error messages ("all_reduce(sum) of Float[4] (call #3 of sub-group [2, 3])").
    #[track_caller]
    fn start(&self, op: Op, tensor: Option<&Tensor>, input: Option<Tensor>) -> (u64, String) {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let call = Call::here(op, tensor.map(Tensor::size).unwrap_or_default(), tensor.map(Tensor::kind));
        let name = format!("{call} (call #{seq}{})", self.world.label);
        self.world.arrive(self.rank, seq, call, input);
        (seq, name)
    }
}

fn bytes(tensor: &Tensor) -> u64 {
    (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64
}

/// This rank's side of all-reduce `seq`, called at `called`, then, with a
/// simulated link, a wait for the link's time. The link's clock starts when
/// the call completes here, that is once every rank has joined: no byte can
/// cross the link before the last rank has handed its tensor over.
fn finish_all_reduce(
    world: &World,
    (rank, seq, called): (usize, u64, Instant),
    name: &str,
    output: &mut Tensor,
    link_time: Option<Duration>,
) -> Result<(), DistError> {
    world.complete_all_reduce(rank, seq, name, output, called)?;
    if let Some(link_time) = link_time {
        sleep_until(Instant::now() + link_time);
    }
    Ok(())
}

impl ProcessGroup for LocalProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn backend(&self) -> &'static str {
        "in-process"
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        self.check_tensor("broadcast", tensor)?;
        self.check_rank("broadcast", "root", root)?;
        self.count(|s| {
            s.broadcast += 1;
            s.collective_bytes += bytes(tensor);
            s.broadcast_bytes += bytes(tensor);
        });
        let input = (self.rank == root).then(|| tensor.shallow_clone());
        let (seq, name) = self.start(Op::Broadcast { root }, Some(tensor), input);
        self.world.complete(self.rank, seq, &name, |shared| tensor.f_copy_(&shared[0]))
    }

    fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        // On this thread: no hand-over to the communication thread to wait for.
        let (seq, name) = self.begin_all_reduce(tensor, op)?;
        let link_time = self.link_time(tensor);
        finish_all_reduce(&self.world, (self.rank, seq, Instant::now()), &name, tensor, link_time)
    }

    fn all_reduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        let (seq, name) = self.begin_all_reduce(tensor, op)?;
        let called = Instant::now(); // its deadline counts from here, not from when the thread gets to it
        let comm = self.comm.get_or_init(|| {
            CommThread::start(format!("comm-{}", self.global_rank())).map_err(|e| e.to_string())
        });
        let Ok(comm) = comm.as_ref() else {
            self.world.give_up(self.rank, seq);
            return Err(self.invalid("all_reduce", "this rank's communication thread could not start"));
        };
        // This rank's side of the all-reduce (and the simulated link's time)
        // runs on its communication thread, while this thread goes on.
        let (world, rank, done) = (self.world.clone(), self.rank, Arc::new(Completion::default()));
        let (mut output, result, job_name) = (tensor.shallow_clone(), done.clone(), name.clone());
        let link_time = self.link_time(tensor);
        let queued = comm.run(move || {
            result.set(finish_all_reduce(&world, (rank, seq, called), &job_name, &mut output, link_time))
        });
        if !queued {
            self.world.give_up(rank, seq);
            return Err(self.invalid("all_reduce", "this rank's communication thread has stopped"));
        }
        let (me, backstop) = (self.global_rank(), self.world.timeout * 2 + Duration::from_secs(30));
        Ok(Work::new(move || done.wait(backstop, me, &name)))
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.check_tensor("all_gather", tensor)?;
        self.count(|s| {
            s.all_gather += 1;
            s.collective_bytes += bytes(tensor);
            s.all_gather_bytes += bytes(tensor) * self.world.size as u64; // the gathered output
        });
        let (seq, name) = self.start(Op::AllGather, Some(tensor), Some(tensor.shallow_clone()));
        self.world
            .complete(self.rank, seq, &name, |shared| shared.iter().map(Tensor::f_detach_copy).collect())
    }

    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        let (seq, name) = self.begin_reduce_scatter(tensor, op)?;
        let rank = self.rank;
        self.world.complete(rank, seq, &name, |shared| shared[rank].f_detach_copy())
    }

    fn reduce_scatter_async(
        &self,
        tensor: &Tensor,
        op: ReduceOp,
        output: &Tensor,
    ) -> Result<Work, DistError> {
        let (seq, name) = self.begin_reduce_scatter(tensor, op)?;
        let comm = self.comm.get_or_init(|| {
            CommThread::start(format!("comm-{}", self.global_rank())).map_err(|e| e.to_string())
        });
        let Ok(comm) = comm.as_ref() else {
            self.world.give_up(self.rank, seq);
            return Err(self.invalid("reduce_scatter", "this rank's communication thread could not start"));
        };
        // This rank's side runs on its communication thread, in the order
        // the calls were made (after any all-reduce queued before it).
        let (world, rank, done) = (self.world.clone(), self.rank, Arc::new(Completion::default()));
        let (mut output, result, job_name) = (output.shallow_clone(), done.clone(), name.clone());
        let queued = comm.run(move || {
            result
                .set(world.complete(rank, seq, &job_name, |shared| output.f_copy_(&shared[rank]).map(|_| ())))
        });
        if !queued {
            self.world.give_up(rank, seq);
            return Err(self.invalid("reduce_scatter", "this rank's communication thread has stopped"));
        }
        let (me, backstop) = (self.global_rank(), self.world.timeout * 2 + Duration::from_secs(30));
        Ok(Work::new(move || done.wait(backstop, me, &name)))
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.count(|s| s.barrier += 1);
        let (seq, name) = self.start(Op::Barrier, None, None);
        self.world.complete(self.rank, seq, &name, |_| Ok(()))
    }

    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        let op = format!("send to rank {dst}{}", self.world.label);
        self.check_tensor(&op, tensor)?;
        self.check_rank(&op, "destination", dst)?;
        if dst == self.rank {
            return Err(self.invalid(&op, "a rank cannot send to itself"));
        }
        // A copy, because the caller may overwrite its buffer as soon as we return.
        let message = tch::no_grad(|| tensor.f_detach_copy()).map_err(|source| DistError::Torch {
            rank: self.global_rank(),
            op: op.clone(),
            cause: source,
        })?;
        self.count(|s| {
            s.send += 1;
            s.p2p_bytes_sent += bytes(tensor);
        });
        self.world.post(self.rank, dst, message, &op)
    }

    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        let op = format!("recv from rank {src}{}", self.world.label);
        self.check_tensor(&op, tensor)?;
        self.check_rank(&op, "source", src)?;
        if src == self.rank {
            return Err(self.invalid(&op, "a rank cannot receive from itself"));
        }
        self.count(|s| s.recv += 1);
        let message = self.world.take_message(src, self.rank, &op)?;
        if message.size() != tensor.size() || message.kind() != tensor.kind() {
            let detail = format!(
                "rank {} sent {:?}{:?} but rank {} receives into {:?}{:?}",
                self.world.global[src],
                message.kind(),
                message.size(),
                self.global_rank(),
                tensor.kind(),
                tensor.size()
            );
            return Err(DistError::Mismatch { rank: self.global_rank(), op, detail });
        }
        tch::no_grad(|| tensor.f_copy_(&message)).map_err(|source| DistError::Torch {
            rank: self.global_rank(),
            op,
            cause: source,
        })
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Group>, DistError> {
        // Agree first, so that ranks passing different lists all get a
        // Mismatch (the list is part of the call) instead of diverging.
        let (seq, name) = self.start(Op::NewGroup(ranks.to_vec()), None, None);
        self.world.complete(self.rank, seq, &name, |_| Ok(()))?;
        // Every rank now checks the same list, so every rank reaches the same verdict.
        if let Some(problem) = group_list_problem(ranks, self.world.size) {
            return Err(self.invalid(&name, problem));
        }
        let Some(sub_rank) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        // The call number is the same on every rank: the members find the same world.
        let world = self.world.sub_group(seq, ranks);
        Ok(Some(Arc::new(LocalProcessGroup::new(sub_rank, world))))
    }

    fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
