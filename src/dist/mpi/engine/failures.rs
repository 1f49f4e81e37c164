//! How the communication thread
//! (`engine.rs`) fails and ends. A missed deadline or a failed MPI call
//! breaks every communicator, and from then on the jobs in flight are kept,
//! never freed, because MPI may still write into their buffers until the
//! job is aborted; the thread's end leaks them for the same reason. Try it:
//! `cargo test --features mpi --test mpi failures`.

use super::super::job::{Action, Active, Reply};
use super::Engine;
use crate::dist::DistError;

impl Engine {
    /// The thread stops. After a failure (a broken engine, or calls still in
    /// flight at the shutdown's deadline) MPI may still write into the
    /// buffers of calls that never completed, until the job is aborted: the
    /// caller must then abort (`MpiWorld::finish` says so, `run` does it),
    /// and until then those buffers must not go back to the allocator, where
    /// a new tensor could receive MPI's late writes. So they are leaked, as
    /// `kept` promises, and the process's end frees them.
    pub(super) fn end(self) {
        if self.broken.is_some() || self.busy() {
            std::mem::forget(self);
        }
    }

    /// A deadline passed: the call fails naming the ranks it waited for,
    /// and the communicators break (MPI cannot take the call back).
    pub(super) fn time_out(&mut self, c: usize, active: Active) -> bool {
        let comm = &self.comms[c];
        let silent = active.silent_peers();
        let mut missing: Vec<usize> = match &active.job.action {
            Action::Recv { src, .. } => vec![*src],
            Action::Send { dst, .. } => vec![*dst],
            _ if !silent.is_empty() => silent,
            // Everyone arrived (or debug mode is off): the transfer itself stalled.
            _ => (0..comm.global.len()).filter(|&r| r != comm.rank).collect(),
        };
        missing.iter_mut().for_each(|r| *r = comm.global[*r]);
        let (rank, op, waited) = (self.world_rank, active.job.name.clone(), self.timeout);
        let error = DistError::Timeout { rank, op, missing, waited };
        let cause = error.to_string();
        self.break_all(active, error, cause);
        true
    }

    /// An MPI call failed. A receive whose sender's signature has arrived
    /// and differs ends as a mismatch (the message was consumed, MPI is
    /// fine); anything else breaks the communicators. A receive whose
    /// signature has not arrived yet is never judged on its empty buffer,
    /// nor freed: MPI would still write the signature into it.
    pub(super) fn fail(&mut self, mut active: Active, message: String) {
        if let Action::Recv { .. } = active.job.action {
            // Tested again here: the data's failure may have been seen first.
            let signature_arrived = matches!(active.signatures_arrived(), Ok(true));
            if signature_arrived && active.first_difference(&active.own_signature).is_some() {
                let c = active.job.comm;
                return self.complete(c, active);
            }
        }
        let (rank, op) = (self.world_rank, active.job.name.clone());
        let error = DistError::Broken { rank, op, cause: message.clone() };
        self.break_all(active, error, message);
    }

    pub(super) fn break_all(&mut self, active: Active, error: DistError, cause: String) {
        active.job.done.set(Err(error));
        self.kept.push(active);
        self.broken = Some(cause.clone());
        let rank = self.world_rank;
        for comm in &mut self.comms {
            for other in comm.queue.drain(..).chain(comm.running.drain(..)) {
                let op = other.job.name.clone();
                other.job.done.set(Err(DistError::Broken { rank, op, cause: cause.clone() }));
                self.kept.push(other);
            }
        }
    }

    /// How the engine ends: cleanly, or naming what never finished.
    pub(super) fn shutdown_result(&self) -> Result<Reply, DistError> {
        let (rank, op) = (self.world_rank, "finishing the MPI group".to_string());
        if let Some(cause) = &self.broken {
            return Err(DistError::Broken { rank, op, cause: cause.clone() });
        }
        let pending: Vec<&str> = self
            .comms
            .iter()
            .flat_map(|c| c.queue.iter().chain(&c.running))
            .map(|a| a.job.name.as_str())
            .collect();
        if pending.is_empty() {
            return Ok(Reply::Done);
        }
        let cause = format!(
            "still in flight after {:?}: {} (never matched by a peer?)",
            self.timeout,
            pending.join("; ")
        );
        Err(DistError::Broken { rank, op, cause })
    }
}
