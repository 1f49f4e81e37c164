//! `send` and `recv` on NCCL. An NCCL send does not
//! complete until its receiver posts the matching receive, and it holds its
//! stream until then: two ranks that each send first and receive second (a
//! ring) would each wait for the other forever. So a send is only queued
//! here, on the host, with a copy of its tensor; the queued sends are
//! posted together with this rank's next receive, in one NCCL group, where
//! they progress at the same time; or on their own before its next
//! collective, and when the group is dropped. The rule that follows (as in
//! PyTorch on NCCL): a send must be received before the receiver's next
//! collective.

use cudarc::nccl::result as nccl;
use tch::Tensor;

use super::super::ffi;
use super::{NcclProcessGroup, SIGNATURE_BYTES};
use crate::dist::DistError;

/// A send that waits, on the host, to be posted.
pub(super) struct QueuedSend {
    data: Tensor,
    signature: Tensor,
    peer: usize,
}

/// One NCCL send or receive of a group: pointer, count, type, peer.
type Transfer = (*mut std::ffi::c_void, usize, cudarc::nccl::sys::ncclDataType_t, i32);

fn transfer(tensor: &Tensor, peer: usize) -> Transfer {
    let kind = ffi::data_type(tensor.kind()).expect("checked before it was queued");
    (ffi::pointer(tensor), tensor.numel(), kind, peer as i32)
}

impl NcclProcessGroup {
    /// What the receiver must expect: the dtype and shape, as bytes.
    fn p2p_signature(&self, tensor: &Tensor) -> Tensor {
        let mut bytes = format!("{:?}{:?}", tensor.kind(), tensor.size()).into_bytes();
        bytes.resize(SIGNATURE_BYTES, 0);
        Tensor::from_slice(&bytes).to_device(self.device())
    }

    /// Queues a copy of `tensor` (on this GPU, contiguous) for `peer`.
    pub(super) fn queue_send(&self, op: &str, tensor: &Tensor, peer: usize) -> Result<(), DistError> {
        let staged = tch::no_grad(|| tensor.f_to_device(self.device()).and_then(|t| t.f_contiguous()));
        let data = staged.map_err(self.torch(op))?.copy(); // the caller may change `tensor` now
        let signature = self.p2p_signature(tensor);
        self.sends.lock().unwrap_or_else(|p| p.into_inner()).push(QueuedSend { data, signature, peer });
        Ok(())
    }

    /// Posts the queued sends, with a receive into `into` from `src` if
    /// given, and waits for them all. NCCL matches the messages between two
    /// ranks by their order alone, so the sends go in rounds of at most one
    /// per peer, the receive in the first; in debug mode each round's
    /// signatures go in a group of their own before its data, and a receive
    /// whose sender's signature differs fails (and aborts the communicator)
    /// before any data moves.
    pub(super) fn exchange(&self, op: &str, receive: Option<(&Tensor, usize)>) -> Result<(), DistError> {
        let mut sends = std::mem::take(&mut *self.sends.lock().unwrap_or_else(|p| p.into_inner()));
        let mut receive = receive;
        while !sends.is_empty() || receive.is_some() {
            let mut round: Vec<QueuedSend> = vec![];
            for send in std::mem::take(&mut sends) {
                match round.iter().any(|s| s.peer == send.peer) {
                    true => sends.push(send), // its peer's earlier send goes first
                    false => round.push(send),
                }
            }
            if self.debug {
                self.check_signatures(op, &round, receive)?;
            }
            let data = round.iter().map(|s| (&s.data, s.peer)).collect();
            self.p2p_group(op, data, receive.take())?;
        }
        Ok(())
    }

    /// One round's signatures, and the check of the one received.
    fn check_signatures(
        &self,
        op: &str,
        round: &[QueuedSend],
        receive: Option<(&Tensor, usize)>,
    ) -> Result<(), DistError> {
        let expected = receive.map(|(into, src)| (self.p2p_signature(into), src));
        let got = expected.as_ref().map(|(sig, src)| (sig.zeros_like(), *src));
        let signatures = round.iter().map(|s| (&s.signature, s.peer)).collect();
        self.p2p_group(op, signatures, got.as_ref().map(|(t, src)| (t, *src)))?;
        let (Some((expected, src)), Some((got, _))) = (expected, got) else { return Ok(()) };
        if got.equal(&expected) {
            return Ok(());
        }
        let text = |t: &Tensor| {
            let bytes = Vec::<u8>::try_from(t.to_device(tch::Device::Cpu)).unwrap_or_default();
            String::from_utf8_lossy(&bytes).trim_end_matches('\0').to_string()
        };
        let detail = format!("rank {src} sent a {}, this rank expects a {}", text(&got), text(&expected));
        self.inner.fail(op, detail.clone()); // the peer's data is on its way: nothing can carry on
        Err(DistError::Mismatch { rank: self.inner.rank, op: op.into(), detail })
    }

    /// One NCCL group of sends and at most one receive, waited for.
    fn p2p_group(
        &self,
        op: &str,
        sends: Vec<(&Tensor, usize)>,
        receive: Option<(&Tensor, usize)>,
    ) -> Result<(), DistError> {
        let mut keep: Vec<Tensor> = sends.iter().map(|(t, _)| t.shallow_clone()).collect();
        keep.extend(receive.map(|(t, _)| t.shallow_clone()));
        let outgoing: Vec<Transfer> = sends.iter().map(|(t, peer)| transfer(t, *peer)).collect();
        let incoming = receive.map(|(t, peer)| transfer(t, peer));
        let pending = self.launch(op, keep, |comm| {
            comm.queue(|_, _| nccl::group_start())?;
            let posted = (|| {
                for (data, count, kind, peer) in outgoing {
                    // SAFETY: every buffer is on this GPU and kept alive by `pending`.
                    comm.queue(|c, s| unsafe { nccl::send(data, count, kind, peer, c, s) })?;
                }
                match incoming {
                    // SAFETY: as above.
                    Some((data, count, kind, peer)) => {
                        comm.queue(|c, s| unsafe { nccl::recv(data, count, kind, peer, c, s) })
                    }
                    None => Ok(()),
                }
            })();
            // Always closed: a thread left inside a group would defer every
            // later NCCL call it makes, the abort included.
            let ended = comm.queue(|_, _| nccl::group_end());
            posted.and(ended)
        })?;
        self.inner.finish(op, pending)
    }
}
