//! src/dist/nccl/collectives.rs: the `ProcessGroup` calls of
//! `NcclProcessGroup` (group.rs has the machinery they share: checks,
//! signatures, launch, and the wait with its deadline).

use cudarc::nccl::result as nccl;
use tch::{Kind, Tensor};

use super::super::ffi;
use super::{on_gpu, NcclProcessGroup, Pending, SIGNATURE_BYTES};
use crate::dist::call::Op;
use crate::dist::{CommStats, DistError, ProcessGroup, ReduceOp, Work};

fn is_float(kind: Kind) -> bool {
    matches!(kind, Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double)
}

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

    /// The point-to-point signature: what the receiver must expect.
    fn p2p_signature(&self, tensor: &Tensor) -> Tensor {
        let mut bytes = format!("{:?}{:?}", tensor.kind(), tensor.size()).into_bytes();
        bytes.resize(SIGNATURE_BYTES as usize, 0);
        Tensor::from_slice(&bytes).to_device(self.device())
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
        self.agree(&self.call(Op::Broadcast { root }, tensor))?;
        self.count(tensor, |s| s.broadcast += 1);
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
        self.agree(&self.call(Op::AllReduce(reduce), tensor))?;
        self.count(tensor, |s| s.all_reduce += 1);
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
        self.agree(&self.call(Op::AllGather, tensor))?;
        self.count(tensor, |s| s.all_gather += 1);
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
        self.agree(&self.call(Op::ReduceScatter(reduce), tensor))?;
        self.count(tensor, |s| s.reduce_scatter += 1);
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

    fn send(&self, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        let op = format!("send to rank {dst}");
        self.check(&op, tensor)?;
        self.check_peer(&op, "destination", dst)?;
        self.prune_sends();
        // A copy of its own: the caller may change `tensor` before NCCL sends it.
        let staged = tch::no_grad(|| tensor.f_to_device(self.device()).and_then(|t| t.f_contiguous()));
        let copy = staged.map_err(self.torch(&op))?.copy();
        let signature = self.p2p_signature(tensor);
        let (data, count, kind) =
            (ffi::pointer(&copy), copy.numel(), ffi::data_type(copy.kind()).expect("checked"));
        let (sig, byte, debug) =
            (ffi::pointer(&signature), ffi::data_type(Kind::Uint8).expect("u8"), self.debug);
        let peer = dst as i32;
        let pending = self.launch(&op, vec![copy.shallow_clone(), signature.shallow_clone()], |comm| {
            // SAFETY: both buffers are on this GPU and kept alive by `pending`.
            if debug {
                comm.queue(|c, s| unsafe { nccl::send(sig, SIGNATURE_BYTES as usize, byte, peer, c, s) })?;
            }
            comm.queue(|c, s| unsafe { nccl::send(data, count, kind, peer, c, s) })
        })?;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.send += 1;
        stats.p2p_bytes_sent += (copy.numel() * copy.kind().elt_size_in_bytes()) as u64;
        self.sends.lock().unwrap_or_else(|p| p.into_inner()).push(pending);
        Ok(())
    }

    fn recv(&self, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        let op = format!("recv from rank {src}");
        self.check(&op, tensor)?;
        self.check_peer(&op, "source", src)?;
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).recv += 1;
        let peer = src as i32;
        if self.debug {
            let expected = self.p2p_signature(tensor);
            let got = expected.zeros_like();
            let (into, byte) = (ffi::pointer(&got), ffi::data_type(Kind::Uint8).expect("u8"));
            let pending = self.launch(&op, vec![got.shallow_clone()], |comm| {
                // SAFETY: `got` is on this GPU and kept alive by `pending`.
                comm.queue(|c, s| unsafe { nccl::recv(into, SIGNATURE_BYTES as usize, byte, peer, c, s) })
            })?;
            self.inner.finish(&op, pending)?;
            if !got.equal(&expected) {
                let text = |t: &Tensor| {
                    let bytes = Vec::<u8>::try_from(t.to_device(tch::Device::Cpu)).unwrap_or_default();
                    String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string()
                };
                let detail =
                    format!("rank {src} sent a {}, this rank expects a {}", text(&got), text(&expected));
                return Err(DistError::Mismatch { rank: self.inner.rank, op, detail });
            }
        }
        let (buf, copied) = on_gpu(tensor, self.device()).map_err(self.torch(&op))?;
        let (data, count, kind) =
            (ffi::pointer(&buf), buf.numel(), ffi::data_type(buf.kind()).expect("checked"));
        let pending: Pending = self.launch(&op, vec![buf.shallow_clone()], |comm| {
            // SAFETY: `buf` is on this GPU and kept alive by `pending`.
            comm.queue(|c, s| unsafe { nccl::recv(data, count, kind, peer, c, s) })
        })?;
        self.inner.finish(&op, pending)?;
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
    /// Sends still in flight hold their buffers: wait for them (bounded by
    /// the deadline) before the communicator goes.
    fn drop(&mut self) {
        let sends = std::mem::take(&mut *self.sends.lock().unwrap_or_else(|p| p.into_inner()));
        for send in sends {
            _ = self.inner.finish("a send still in flight when the group was dropped", send);
        }
    }
}
