//! The leaders' part of a shared-memory
//! all-reduce across nodes (`shm.rs` says when it runs): node k's leader
//! receives the partial sum of nodes 0..k into its node's result area, and
//! passes its node's on; the last leader broadcasts the total. Try it:
//! `cargo test --features mpi --test mpi shared_memory::across`.

use super::super::ffi::{self, Request};
use super::slices::Call;
use super::{sys_u8, Node, Phase};

/// Whether the leaders can pass a sum of `bytes` on as one MPI message
/// (MPI counts in `int`: at most 2^31 - 1 bytes, or fewer under the test
/// hook `DDP_MPI_MOST_PER_CALL`). A longer all-reduce across nodes is
/// folded over messages in pieces instead (`../ordered.rs`): the same
/// rank-order sum. Every rank decides alike from the tensor's size, which
/// the call's signature makes the same on every rank (with `DDP_DEBUG=off`
/// ranks that pass sizes on both sides of the line wait for each other
/// until the deadline, instead of getting a `Mismatch`).
pub(super) fn fits_the_leaders(bytes: usize, spread: bool) -> bool {
    !spread || bytes <= ffi::most()
}

impl Node {
    /// On a leader of a node after the first: starts receiving the
    /// previous nodes' partial sum into the result area.
    pub(super) fn receive_previous(&self, call: &Call) -> Result<Option<Request>, String> {
        let Some((leaders, index, _)) = self.leaders.filter(|_| !self.first) else { return Ok(None) };
        // SAFETY: the result area lives in the window, which outlives the call.
        let request =
            unsafe { ffi::irecv(call.result.cast(), call.bytes(), index - 1, ffi::TAG_NODE_CHAIN, leaders)? };
        Ok(Some(request))
    }

    /// On a leader, once its node's slices are reduced (`Reduced`): sends
    /// the partial sum to the next leader, or, on the last node, and on the
    /// others once they sent theirs (`SendNext`), joins the broadcast of the
    /// total from the last leader. The request, and the phase it ends.
    pub(super) fn pass_on(&self, call: &Call, phase: Phase) -> Result<(Request, Phase), String> {
        let (leaders, index, nodes) = self.leaders.expect("a leader");
        if phase == Phase::Reduced && index + 1 < nodes {
            // SAFETY: the result area outlives the call; nobody writes it until the send completes.
            let request = unsafe {
                ffi::isend(call.result.cast(), call.bytes(), index + 1, ffi::TAG_NODE_CHAIN, leaders)?
            };
            return Ok((request, Phase::SendNext));
        }
        let all = call.result_bytes();
        // SAFETY: as above; the last leader sends it, the others receive into it.
        let mut requests = Vec::with_capacity(1);
        unsafe { ffi::ibcast(&all, sys_u8(), nodes - 1, leaders, &mut requests)? };
        // One request: `Node::takes` sent anything longer over messages.
        Ok((requests.pop().expect("one broadcast"), Phase::Broadcast))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_over_2_gib_across_nodes_does_not_fit_the_leaders_and_one_node_or_less_does() {
        let most = ffi::MOST_PER_CALL;
        assert!(fits_the_leaders(most, true) && fits_the_leaders(most + 1, false));
        assert!(!fits_the_leaders(most + 1, true));
    }
}
