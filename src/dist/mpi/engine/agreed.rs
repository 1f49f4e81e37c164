//! The calls the communication thread makes
//! with MPI's blocking functions, which have no deadline: `new_group`'s
//! split and `alloc_buffer`'s shared memory. Both are always agreed first
//! (their signatures exchanged, whatever `DDP_DEBUG` says), so every rank
//! has reached the call before any rank blocks in it. Try it:
//! `cargo test --features solutions,mpi,nccl --test mpi zero_copy`.

use std::collections::VecDeque;

use super::super::ffi;
use super::super::job::{Action, Active, Reply};
use super::{CommState, Engine};
use crate::dist::call::group_list_problem;
use crate::dist::DistError;

impl Engine {
    /// Makes `active`'s call if it is one of the blocking calls (every
    /// rank agreed on it) and ends it with the reply; `Some(active)` back
    /// for any other call.
    pub(super) fn made_after_agreement(
        &mut self,
        c: usize,
        active: Active,
    ) -> Result<Option<Active>, (Box<Active>, String)> {
        let reply = match &active.job.action {
            Action::NewGroup { ranks } => self.split(c, &active.job.name, ranks),
            Action::AllocBuffer { bytes, shareable } => {
                // The node's memory serves the world's all-reduces only.
                let shared = match (*shareable && c == 0, self.node.as_mut()) {
                    (true, Some(node)) => node.share(*bytes),
                    _ => Ok(None),
                };
                shared.map(|at| Ok(Reply::Buffer(at.map(|p| p as usize))))
            }
            _ => return Ok(Some(active)),
        };
        match reply {
            Ok(reply) => {
                self.finish_later(c, active, reply);
                Ok(None)
            }
            Err(message) => Err((Box::new(active), message)),
        }
    }

    /// new_group, once every rank agreed on the list: check it (every rank
    /// reaches the same verdict), then split the communicator.
    fn split(&mut self, c: usize, name: &str, ranks: &[usize]) -> Result<Result<Reply, DistError>, String> {
        let comm = &self.comms[c];
        if let Some(detail) = group_list_problem(ranks, comm.global.len()) {
            return Ok(Err(DistError::Invalid { rank: self.world_rank, op: name.to_string(), detail }));
        }
        let position = ranks.iter().position(|&r| r == comm.rank);
        let global: Vec<usize> = ranks.iter().map(|&r| comm.global[r]).collect();
        let Some(raw) = ffi::split(comm.raw, position)? else { return Ok(Ok(Reply::Group(None))) };
        let rank = position.expect("a member gets a communicator");
        let fresh = CommState {
            raw,
            rank,
            global: global.clone(),
            queue: VecDeque::new(),
            running: vec![],
            collectives: 0,
        };
        self.comms.push(fresh);
        Ok(Ok(Reply::Group(Some((self.comms.len() - 1, rank, global)))))
    }
}
