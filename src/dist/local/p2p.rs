//! Point-to-point messages of the in-process backend: `send` queues a copy in
//! the destination's mailbox and returns (a buffered send), `recv` takes the
//! oldest message from a source, waiting for one. Part of [`World`]; the
//! rendezvous of collectives is in `rendezvous.rs`. Try it: `cargo test --test dist`.

use std::collections::VecDeque;
use std::time::Instant;

use tch::Tensor;

use super::world::World;
use crate::dist::DistError;

impl World {
    /// Queues a message from `src` to `dst`, unless `dst` has left.
    pub fn post(&self, src: usize, dst: usize, message: Tensor, op_name: &str) -> Result<(), DistError> {
        let mut state = self.lock();
        if let Some(reason) = state.gone[dst].clone() {
            let (rank, peer) = (self.global[src], self.global[dst]);
            return Err(DistError::PeerGone { rank, op: op_name.to_string(), peer, reason });
        }
        state.mailboxes.entry((src, dst)).or_default().push_back(message);
        drop(state);
        self.notify();
        Ok(())
    }

    /// Takes the oldest message from `src` to `dst`, waiting for one to come.
    /// Messages that `src` sent before it left are still delivered.
    pub fn take_message(&self, src: usize, dst: usize, op_name: &str) -> Result<Tensor, DistError> {
        let deadline = Instant::now().checked_add(self.timeout);
        let (mut state, mut watched) = (self.lock(), false);
        loop {
            if let Some(message) = state.mailboxes.get_mut(&(src, dst)).and_then(VecDeque::pop_front) {
                return Ok(message);
            }
            if let Some(error) = self.wait_failure(&state.gone, dst, &[src], deadline, op_name) {
                return Err(error);
            }
            state = self.wait(state, deadline, &mut watched);
        }
    }
}
