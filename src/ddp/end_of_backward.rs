//! The check at the end of an overlapped
//! backward (`overlap.rs`), on what went into the buckets' slots: whether
//! some rank's backward failed, and which parameters got no gradient on
//! some rank. One all-reduce, and every rank reaches the same verdict, so
//! that no rank hangs and no replica steps alone.

use tch::Tensor;

use super::buckets::GradientBuckets;
use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp};
use crate::models::Named;

/// What this rank brings to the end-of-backward check.
pub(super) struct EndOfBackward<'a> {
    /// The parameters whose gradient-ready hook did not fire here.
    pub unused: &'a [usize],
    /// Whether this rank's `loss.backward()` returned an error.
    pub backward_failed: bool,
    pub find_unused_parameters: bool,
    /// The sync's name, for the all-reduce's tag.
    pub tag: &'a str,
}

impl GradientBuckets {
    /// A rank whose backward failed, or a parameter without a gradient, still
    /// sent its buckets (zeros in the missing slots), so that no rank hangs.
    /// Then every rank learns which ranks' backward failed, which parameters
    /// got no gradient on some rank, and which got one on some rank: one
    /// all-reduce (MAX) of `[unused here (n) | used here (n) | backward failed,
    /// per rank]`. Every rank reaches the same verdict: a failed backward anywhere
    /// fails the step everywhere (the failing rank gets `PeerGone` naming
    /// itself here; its caller reports its own backward error instead); so
    /// does a parameter without a gradient unless unused parameters were
    /// expected. When they were, a parameter that this rank did not use but
    /// another did gets the averaged gradient here too, so that every replica
    /// takes the same step.
    pub(super) fn end_of_backward_check(
        &self,
        pg: &dyn ProcessGroup,
        params: &[Named],
        this_rank: EndOfBackward<'_>,
    ) -> Result<(), DistError> {
        let (n, world) = (params.len() as i64, pg.world_size() as i64);
        // On the parameters' device: a GPU backend moves GPU tensors only.
        let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        let mut flags = Tensor::zeros([2 * n + world], (tch::Kind::Int, device));
        let _ = flags.narrow(0, n, n).fill_(1); // used here, until marked unused below
        for &i in this_rank.unused {
            let _ = flags.get(i as i64).fill_(1);
            let _ = flags.get(n + i as i64).fill_(0);
        }
        if this_rank.backward_failed {
            let _ = flags.get(2 * n + pg.rank() as i64).fill_(1);
        }
        tagged(format!("{}, end-of-backward check", this_rank.tag), || {
            pg.all_reduce(&mut flags, ReduceOp::Max)
        })?;
        let flags: Vec<i32> = Vec::try_from(flags.to_device(tch::Device::Cpu))
            .map_err(torch_error(pg, "reading the end-of-backward flags"))?;
        let (unused_somewhere, used_somewhere, failed) =
            (&flags[..n as usize], &flags[n as usize..2 * n as usize], &flags[2 * n as usize..]);

        if let Some(peer) = failed.iter().position(|&f| f != 0) {
            let reason = "returned an error from loss.backward() in this step (its own error says why); \
                          every rank fails the step, since the averages would mix in its missing gradients";
            return Err(DistError::PeerGone {
                rank: pg.rank(),
                op: format!("the gradient sync at the end of backward ({})", this_rank.tag),
                peer,
                reason: reason.into(),
            });
        }
        let unused_anywhere: Vec<usize> = (0..params.len()).filter(|&i| unused_somewhere[i] != 0).collect();
        if unused_anywhere.is_empty() {
            return Ok(());
        }
        if !this_rank.find_unused_parameters {
            let names: Vec<&str> = unused_anywhere.iter().map(|&i| params[i].0.as_str()).collect();
            let detail = format!(
                "parameter(s) {names:?} got no gradient in this backward pass on at least one rank. Their \
                 buckets were sent with zeros in their place, so every rank still agrees; but a model \
                 that skips parameters must say so: pass `find_unused_parameters: true` (PyTorch's \
                 find_unused_parameters=True), or use every parameter in the loss"
            );
            return Err(DistError::Invalid {
                rank: pg.rank(),
                op: "gradient sync at the end of backward".into(),
                detail,
            });
        }
        for &i in this_rank.unused {
            if used_somewhere[i] != 0 {
                self.install(pg, i, params)?; // its slot holds the others' average
            }
        }
        Ok(())
    }
}
