//! `MpiProcessGroup`, the `ProcessGroup` of one
//! process started by mpirun. It checks and names each call, hands it to
//! the communication thread (`engine.rs`) and waits for the result. Try it:
//! `cargo test --features mpi --test mpi`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};

use super::engine::Command;
use super::ffi;
use super::job::{byte_len, Action, Done, Job, Reply};
use crate::dist::call::{Call, Op};
use crate::dist::{CommStats, DistError, Group, ProcessGroup, ReduceOp, Work};

mod checks;

/// What every handle of one process shares: the line to the communication
/// thread and the settings.
pub(crate) struct Shared {
    pub commands: Mutex<Sender<Command>>,
    pub timeout: Duration,
    /// Exchange a signature before each collective (`DDP_DEBUG`, on unless "off").
    pub debug: bool,
    pub world_rank: usize,
}

/// One process's handle on an MPI communicator: the world, or a sub-group
/// made with `new_group`. Each handle counts its own calls.
pub struct MpiProcessGroup {
    shared: Arc<Shared>,
    comm: usize,
    rank: usize,
    /// World rank of each member.
    global: Vec<usize>,
    label: String,
    next_seq: AtomicU64,
    stats: Mutex<CommStats>,
}

impl MpiProcessGroup {
    pub(crate) fn new(
        shared: Arc<Shared>,
        comm: usize,
        rank: usize,
        global: Vec<usize>,
        label: String,
    ) -> Self {
        MpiProcessGroup {
            shared,
            comm,
            rank,
            global,
            label,
            next_seq: AtomicU64::new(0),
            stats: Mutex::default(),
        }
    }

    fn count(&self, update: impl FnOnce(&mut CommStats)) {
        update(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn invalid(&self, op: &str, detail: impl Into<String>) -> DistError {
        DistError::Invalid { rank: self.shared.world_rank, op: op.to_string(), detail: detail.into() }
    }

    fn torch(&self, op: &str) -> impl FnOnce(tch::TchError) -> DistError {
        let (rank, op) = (self.shared.world_rank, op.to_string());
        move |cause| DistError::Torch { rank, op, cause }
    }

    /// The next collective's name ("all_reduce(sum) of Float[4] (call #3)")
    /// and, in debug mode, the signature its peers must match.
    #[track_caller]
    fn name(&self, op: Op, tensor: Option<&Tensor>, always_sign: bool) -> (String, Option<String>) {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let call = Call::here(op, tensor.map(Tensor::size).unwrap_or_default(), tensor.map(Tensor::kind));
        let signature = (self.shared.debug || always_sign).then(|| call.signature());
        (format!("{call} (call #{seq}{})", self.label), signature)
    }

    fn submit(
        &self,
        action: Action,
        name: String,
        signature: Option<String>,
    ) -> Result<Arc<Done>, DistError> {
        let done = Arc::new(Done::default());
        let queued = Instant::now();
        let job = Job { comm: self.comm, action, name: name.clone(), signature, done: done.clone(), queued };
        let sent = self.shared.commands.lock().unwrap_or_else(|p| p.into_inner()).send(Command::Run(job));
        sent.map_err(|_| DistError::Broken {
            rank: self.shared.world_rank,
            op: name,
            cause: "the MPI communication thread has stopped (the group was finished)".into(),
        })?;
        Ok(done)
    }

    fn wait(&self, done: &Done, name: &str) -> Result<Reply, DistError> {
        done.wait(self.shared.timeout + Duration::from_secs(30), self.shared.world_rank, name)
    }

    fn call(&self, action: Action, name: String, signature: Option<String>) -> Result<Reply, DistError> {
        let done = self.submit(action, name.clone(), signature)?;
        self.wait(&done, &name)
    }
}

/// The tensor itself when it is contiguous (MPI reads and writes its
/// memory: no copy), else a contiguous copy to copy back afterwards.
fn contiguous(tensor: &Tensor) -> Result<(Tensor, bool), tch::TchError> {
    if tensor.is_contiguous() {
        return Ok((tensor.shallow_clone(), false));
    }
    Ok((tch::no_grad(|| tensor.f_contiguous())?, true))
}

impl ProcessGroup for MpiProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.global.len()
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        self.check_tensor("broadcast", tensor)?;
        self.check_rank("broadcast", "root", root)?;
        self.count(|s| {
            s.broadcast += 1;
            s.collective_bytes += byte_len(tensor) as u64;
            s.broadcast_bytes += byte_len(tensor) as u64;
        });
        let (buf, copied) = contiguous(tensor).map_err(self.torch("broadcast"))?;
        let (name, signature) = self.name(Op::Broadcast { root }, Some(tensor), false);
        self.call(Action::Broadcast { buf: buf.shallow_clone(), root }, name, signature)?;
        if copied {
            tch::no_grad(|| tensor.f_copy_(&buf)).map_err(self.torch("broadcast"))?;
        }
        Ok(())
    }

    fn all_reduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        self.check_tensor("all_reduce", tensor)?;
        self.check_reduction("all_reduce", tensor, op)?;
        self.count(|s| {
            s.all_reduce += 1;
            s.collective_bytes += byte_len(tensor) as u64;
            s.all_reduce_bytes += byte_len(tensor) as u64;
        });
        let (mut buf, copied) = contiguous(tensor).map_err(self.torch("all_reduce"))?;
        let (name, signature) = self.name(Op::AllReduce(op), Some(tensor), false);
        let done =
            self.submit(Action::AllReduce { buf: buf.shallow_clone(), op }, name.clone(), signature)?;
        let (shared, size, mut output) = (self.shared.clone(), self.global.len(), tensor.shallow_clone());
        Ok(Work::new(move || {
            let backstop = shared.timeout + Duration::from_secs(30);
            done.wait(backstop, shared.world_rank, &name)?;
            let torch = |cause| DistError::Torch { rank: shared.world_rank, op: name.clone(), cause };
            tch::no_grad(|| {
                if op == ReduceOp::Avg {
                    _ = buf.f_div_scalar_(size as f64)?; // MPI has no average: sum, then divide
                }
                if copied {
                    output.f_copy_(&buf)?;
                }
                Ok(())
            })
            .map_err(torch)
        }))
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        self.check_tensor("all_gather", tensor)?;
        self.count(|s| {
            s.all_gather += 1;
            s.collective_bytes += byte_len(tensor) as u64;
            s.all_gather_bytes += byte_len(tensor) as u64 * self.global.len() as u64;
        });
        let (input, _) = contiguous(tensor).map_err(self.torch("all_gather"))?;
        let size = self.global.len() as i64;
        let mut shape = vec![size];
        shape.extend(tensor.size());
        let output =
            Tensor::f_empty(&shape, (tensor.kind(), Device::Cpu)).map_err(self.torch("all_gather"))?;
        let (name, signature) = self.name(Op::AllGather, Some(tensor), false);
        self.call(Action::AllGather { input, output: output.shallow_clone() }, name, signature)?;
        Ok(output.unbind(0)) // views of one buffer, one per rank
    }

    fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor, DistError> {
        self.check_tensor("reduce_scatter", tensor)?;
        let size = self.global.len() as i64;
        let rows = tensor.size().first().copied().unwrap_or(0);
        if tensor.dim() == 0 || rows % size != 0 {
            let shape = tensor.size();
            let detail = format!("dimension 0 of a {shape:?} tensor does not split into {size} equal chunks");
            return Err(self.invalid("reduce_scatter", detail));
        }
        self.check_reduction("reduce_scatter", tensor, op)?;
        self.count(|s| {
            s.reduce_scatter += 1;
            s.collective_bytes += byte_len(tensor) as u64;
            s.reduce_scatter_bytes += byte_len(tensor) as u64;
        });
        let (input, _) = contiguous(tensor).map_err(self.torch("reduce_scatter"))?;
        let mut shape = tensor.size();
        shape[0] /= size;
        let mut output =
            Tensor::f_empty(&shape, (tensor.kind(), Device::Cpu)).map_err(self.torch("reduce_scatter"))?;
        let (name, signature) = self.name(Op::ReduceScatter(op), Some(tensor), false);
        self.call(Action::ReduceScatter { input, output: output.shallow_clone(), op }, name, signature)?;
        if op == ReduceOp::Avg {
            _ = tch::no_grad(|| output.f_div_scalar_(size as f64)).map_err(self.torch("reduce_scatter"))?;
        }
        Ok(output)
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.count(|s| s.barrier += 1);
        let (name, signature) = self.name(Op::Barrier, None, false);
        self.call(Action::Barrier, name, signature).map(|_| ())
    }

    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        let op = format!("send to rank {dst}{}", self.label);
        self.check_tensor(&op, tensor)?;
        self.check_rank(&op, "destination", dst)?;
        if dst == self.rank {
            return Err(self.invalid(&op, "a rank cannot send to itself"));
        }
        // A copy, because the caller may overwrite its tensor as soon as we return.
        let data = tch::no_grad(|| tensor.f_contiguous()?.f_detach_copy()).map_err(self.torch(&op))?;
        self.count(|s| {
            s.send += 1;
            s.p2p_bytes_sent += byte_len(tensor) as u64;
        });
        let signature = format!("{:?}{:?}", tensor.kind(), tensor.size());
        self.submit(Action::Send { data, dst }, op, Some(signature)).map(|_| ())
    }

    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        let op = format!("recv from rank {src}{}", self.label);
        self.check_tensor(&op, tensor)?;
        self.check_rank(&op, "source", src)?;
        if src == self.rank {
            return Err(self.invalid(&op, "a rank cannot receive from itself"));
        }
        self.count(|s| s.recv += 1);
        // Into a scratch buffer, always: the data's receive is posted with
        // the signature's (point_to_point.rs), so a message found to be of
        // another dtype or shape has already landed; the caller's tensor
        // gets only a message that passed the check.
        let into = Tensor::f_empty(tensor.size(), (tensor.kind(), Device::Cpu)).map_err(self.torch(&op))?;
        let signature = format!("{:?}{:?}", tensor.kind(), tensor.size());
        self.call(Action::Recv { into: into.shallow_clone(), src }, op.clone(), Some(signature))?;
        tch::no_grad(|| tensor.f_copy_(&into)).map_err(self.torch(&op))?;
        Ok(())
    }

    fn new_group(&self, ranks: &[usize]) -> Result<Option<Group>, DistError> {
        // Always agreed first (whatever DDP_DEBUG says): the split below is
        // a blocking MPI call, safe only once every rank has reached it.
        let (name, signature) = self.name(Op::NewGroup(ranks.to_vec()), None, true);
        match self.call(Action::NewGroup { ranks: ranks.to_vec() }, name, signature)? {
            Reply::Group(Some((comm, rank, global))) => {
                let label = format!(" of sub-group {global:?}");
                Ok(Some(Arc::new(MpiProcessGroup::new(self.shared.clone(), comm, rank, global, label))))
            }
            _ => Ok(None),
        }
    }

    /// A buffer in the node's shared memory (`shm/regions.rs`: when, and
    /// why it is never freed), or a plain zeroed tensor where there is none.
    fn alloc_buffer(&self, numel: usize, kind: Kind, device: Device) -> Result<Tensor, DistError> {
        let (call, seq) = (
            format!("alloc_buffer of {kind:?}[{numel}] on {device:?}"),
            self.next_seq.fetch_add(1, Ordering::SeqCst),
        );
        let name = format!("{call} (call #{seq}{})", self.label);
        let shareable = device == Device::Cpu && ffi::datatype(kind).is_some() && numel > 0;
        let bytes = numel * kind.elt_size_in_bytes();
        // Always signed: the allocation blocks, safe once every rank is there.
        match self.call(Action::AllocBuffer { bytes, shareable }, name, Some(call))? {
            // SAFETY: `numel` elements of `kind` at `at`, mapped until the process exits.
            Reply::Buffer(Some(at)) => {
                Ok(unsafe { Tensor::from_blob(at as *const u8, &[numel as i64], &[1], kind, Device::Cpu) })
            }
            _ => Tensor::f_zeros([numel as i64], (kind, device)).map_err(self.torch("alloc_buffer")),
        }
    }

    fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
