//! The leaders' part of a shared-memory
//! all-reduce across nodes (`shm.rs` says when it runs): node k's leader
//! receives the partial sum of nodes 0..k into its node's result area, and
//! passes its node's on; the last leader broadcasts the total. Try it:
//! `cargo test --features mpi --test mpi shared_memory::across`.

use super::super::ffi::{self, Request};
use super::slices::Call;
use super::{sys_u8, Node, Phase};

/// The largest message between leaders: MPI counts in `int`, here bytes.
pub(super) const MOST_BYTES_BETWEEN_LEADERS: usize = i32::MAX as usize;

/// Why a tensor of `bytes` cannot be all-reduced across nodes through
/// shared memory, in words, or `None` when it can.
pub(super) fn too_large_for_the_leaders(bytes: usize, spread: bool) -> Option<String> {
    (spread && bytes > MOST_BYTES_BETWEEN_LEADERS).then(|| {
        format!(
            "{bytes} bytes is more than the nodes' leaders pass in one MPI message ({MOST_BYTES_BETWEEN_LEADERS} \
             bytes, MPI counts in int): all-reduce the tensor in parts (`chunk`), one call per part, or \
             reduce over messages (DDP_MPI_SHM=off), which carry any size"
        )
    })
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
        // One request: `too_large_for_the_leaders` refused anything longer.
        Ok((requests.pop().expect("one broadcast"), Phase::Broadcast))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_over_2_gib_across_nodes_is_refused_in_words_and_one_node_or_less_is_not() {
        assert_eq!(too_large_for_the_leaders(MOST_BYTES_BETWEEN_LEADERS, true), None);
        assert_eq!(too_large_for_the_leaders(MOST_BYTES_BETWEEN_LEADERS + 1, false), None);
        let refusal = too_large_for_the_leaders(MOST_BYTES_BETWEEN_LEADERS + 1, true).expect("refused");
        assert!(refusal.contains("2147483647 bytes") && refusal.contains("chunk"), "{refusal}");
    }
}
