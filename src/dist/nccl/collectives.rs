//! The `ProcessGroup` calls of
//! `NcclProcessGroup` (group.rs has the machinery they share: checks,
//! signatures, launch, and the wait with its deadline).

use cudarc::nccl::result as nccl;
use tch::{Kind, Tensor};

use super::super::ffi;
use super::{on_gpu, NcclProcessGroup};
use crate::dist::call::Op;
use crate::dist::{is_float, CommStats, DistError, ProcessGroup, ReduceOp, Work};

impl NcclProcessGroup {
    fn check_peer(&self, op: &str, what: &str, peer: usize) -> Result<(), DistError> {
        match peer < self.world {
            true => Ok(()),
            false => {
                Err(self.invalid(op, format!("{what} {peer} is not a rank of a group of {}", self.world)))
            }
        }
    }

    fn check_reduction(&self, op: &str, tensor: &Tensor, reduce: ReduceOp) -> Result<(), DistError> {
        let kind = tensor.kind();
        if reduce == ReduceOp::Avg && !is_float(kind) {
            return Err(self.invalid(op, format!("avg needs a floating-point tensor, got {kind:?}")));
        }
        if kind == Kind::Bool && !matches!(reduce, ReduceOp::Min | ReduceOp::Max) {
            let detail = "booleans reduce with min or max only (NCCL carries them as bytes)";
            return Err(self.invalid(op, detail.into()));
        }
        Ok(())
    }
}

impl ProcessGroup for NcclProcessGroup {
    fn rank(&self) -> usize {
        self.inner.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    fn broadcast(&self, tensor: &mut Tensor, root: usize) -> Result<(), DistError> {
        let op = "broadcast";
        self.check(op, tensor)?;
        self.check_peer(op, "root", root)?;
        self.exchange(op, None)?; // sends go before the next collective (p2p.rs)
        self.agree(&self.call(Op::Broadcast { root }, tensor))?;
        self.count(tensor, |s| {
            s.broadcast += 1;
            s.broadcast_bytes += (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
        });
        let (buf, copied) = on_gpu(tensor, self.device()).map_err(self.torch(op))?;
        let (data, count, kind) =
            (ffi::pointer(&buf), buf.numel(), ffi::data_type(buf.kind()).expect("checked"));
        let pending = self.launch(op, vec![buf.shallow_clone()], |comm| {
            // SAFETY: `buf` is on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::broadcast(data, data, count, kind, root as i32, c, s) })
        })?;
        self.inner.finish(op, pending)?;
        if copied {
            tch::no_grad(|| tensor.f_copy_(&buf)).map_err(self.torch(op))?;
        }
        Ok(())
    }

    fn all_reduce_async(&self, tensor: &Tensor, reduce: ReduceOp) -> Result<Work, DistError> {
        let op = format!("all_reduce({})", reduce.name());
        self.check(&op, tensor)?;
        self.check_reduction(&op, tensor, reduce)?;
        self.exchange(&op, None)?; // sends go before the next collective (p2p.rs)
        self.agree(&self.call(Op::AllReduce(reduce), tensor))?;
        self.count(tensor, |s| {
            s.all_reduce += 1;
            s.all_reduce_bytes += (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
        });
        let (buf, copied) = on_gpu(tensor, self.device()).map_err(self.torch(&op))?;
        let (data, count, kind) =
            (ffi::pointer(&buf), buf.numel(), ffi::data_type(buf.kind()).expect("checked"));
        let how = ffi::reduction(reduce);
        let pending = self.launch(&op, vec![buf.shallow_clone()], |comm| {
            // SAFETY: `buf` is on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::all_reduce(data, data, count, kind, how, c, s) })
        })?;
        let (inner, released) = (self.inner.clone(), self.inner.clone());
        let (target, release_op) = (tensor.shallow_clone(), op.clone());
        let pending = std::sync::Arc::new(std::sync::Mutex::new(Some(pending)));
        let unwaited = pending.clone();
        let rank = self.inner.rank;
        Ok(Work::with_release(
            move || {
                let pending = pending.lock().unwrap_or_else(|p| p.into_inner()).take().expect("waited once");
                inner.finish(&op, pending)?;
                if copied {
                    let mut target = target;
                    tch::no_grad(|| target.f_copy_(&buf)).map_err(|cause| DistError::Torch {
                        rank,
                        op: op.clone(),
                        cause,
                    })?;
                }
                Ok(())
            },
            // Dropped unwaited: NCCL may still be writing into the buffer, so
            // keep it until the collective is done (or the deadline aborts it).
            move || {
                if let Some(pending) = unwaited.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    _ = released.finish(&release_op, pending);
                }
            },
        ))
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>, DistError> {
        let op = "all_gather";
        self.check(op, tensor)?;
        self.exchange(op, None)?; // sends go before the next collective (p2p.rs)
        self.agree(&self.call(Op::AllGather, tensor))?;
        self.count(tensor, |s| {
            s.all_gather += 1;
            s.all_gather_bytes +=
                (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64 * self.world as u64;
        });
        let (input, _) = on_gpu(tensor, self.device()).map_err(self.torch(op))?;
        let mut shape = vec![self.world as i64];
        shape.extend(tensor.size());
        let output = Tensor::empty(shape.as_slice(), (tensor.kind(), self.device()));
        let (send, receive, count) = (ffi::pointer(&input), ffi::pointer(&output), input.numel());
        let kind = ffi::data_type(input.kind()).expect("checked");
        let pending = self.launch(op, vec![input.shallow_clone(), output.shallow_clone()], |comm| {
            // SAFETY: both buffers are on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::all_gather(send, receive, count, kind, c, s) })
        })?;
        self.inner.finish(op, pending)?;
        Ok(output.to_device(tensor.device()).unbind(0))
    }

    fn reduce_scatter(&self, tensor: &Tensor, reduce: ReduceOp) -> Result<Tensor, DistError> {
        let op = format!("reduce_scatter({})", reduce.name());
        self.check(&op, tensor)?;
        self.check_reduction(&op, tensor, reduce)?;
        let mut shape = tensor.size();
        if shape.is_empty() || shape[0] % self.world as i64 != 0 {
            let detail =
                format!("dimension 0 of a {shape:?} tensor does not split into {} equal chunks", self.world);
            return Err(self.invalid(&op, detail));
        }
        self.exchange(&op, None)?; // sends go before the next collective (p2p.rs)
        self.agree(&self.call(Op::ReduceScatter(reduce), tensor))?;
        self.count(tensor, |s| {
            s.reduce_scatter += 1;
            s.reduce_scatter_bytes += (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
        });
        shape[0] /= self.world as i64;
        let (input, _) = on_gpu(tensor, self.device()).map_err(self.torch(&op))?;
        let output = Tensor::empty(shape.as_slice(), (tensor.kind(), self.device()));
        let (send, receive, count) = (ffi::pointer(&input), ffi::pointer(&output), output.numel());
        let (kind, how) = (ffi::data_type(input.kind()).expect("checked"), ffi::reduction(reduce));
        let pending = self.launch(&op, vec![input.shallow_clone(), output.shallow_clone()], |comm| {
            // SAFETY: both buffers are on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::reduce_scatter(send, receive, count, kind, how, c, s) })
        })?;
        self.inner.finish(&op, pending)?;
        Ok(output.to_device(tensor.device()))
    }

    fn barrier(&self) -> Result<(), DistError> {
        self.exchange("barrier", None)?;
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).barrier += 1;
        let token = Tensor::zeros([1], (Kind::Float, self.device()));
        let data = ffi::pointer(&token);
        let (kind, how) = (ffi::data_type(Kind::Float).expect("f32"), ffi::reduction(ReduceOp::Sum));
        let pending = self.launch("barrier", vec![token.shallow_clone()], |comm| {
            // SAFETY: `token` is on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::all_reduce(data, data, 1, kind, how, c, s) })
        })?;
        self.inner.finish("barrier", pending)
    }

    /// Queued, not posted: see p2p.rs for why.
    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        let op = format!("send to rank {dst}");
        self.check(&op, tensor)?;
        self.check_peer(&op, "destination", dst)?;
        if dst == self.inner.rank {
            return Err(self.invalid(&op, "a rank cannot send to itself: copy the tensor instead".into()));
        }
        self.queue_send(&op, tensor, dst)?;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.send += 1;
        stats.p2p_bytes_sent += (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
        Ok(())
    }

    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        let op = format!("recv from rank {src}");
        self.check(&op, tensor)?;
        self.check_peer(&op, "source", src)?;
        if src == self.inner.rank {
            return Err(self.invalid(&op, "a rank cannot receive from itself".into()));
        }
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).recv += 1;
        let (buf, copied) = on_gpu(tensor, self.device()).map_err(self.torch(&op))?;
        self.exchange(&op, Some((&buf, src)))?; // with this rank's queued sends
        if copied {
            tch::no_grad(|| tensor.f_copy_(&buf)).map_err(self.torch(&op))?;
        }
        Ok(())
    }

    fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for NcclProcessGroup {
    /// Sends still queued are posted and waited for (until the deadline),
    /// so that their receivers get them.
    fn drop(&mut self) {
        _ = self.exchange("sends still queued when the group was dropped", None);
    }
}
