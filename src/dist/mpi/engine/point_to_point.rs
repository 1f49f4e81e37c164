//! How the communication thread
//! carries `send` and `recv`: each message is preceded by its signature
//! (dtype and shape), so a receive into the wrong tensor ends as a
//! `Mismatch` naming both sides instead of MPI's truncation error or a
//! silent reinterpretation of the bytes. Try it:
//! `cargo test --features mpi --test mpi collectives`.

use super::super::ffi::{self, Comm};
use super::super::job::{byte_len, Action, Active};
use super::Engine;
use crate::dist::DistError;

/// The sender's side of a point-to-point call: the signature (dtype and
/// shape), then the data.
pub(super) fn send_side(active: &mut Active, dst: usize, comm: Comm) -> Result<(), String> {
    active.send_signature(dst, ffi::TAG_P2P_SIGNATURE, comm)?;
    active.post(comm, 0, (0, 0))
}

/// The receiver's side: the sender's signature, then the data.
pub(super) fn receive_side(active: &mut Active, src: usize, comm: Comm) -> Result<(), String> {
    active.receive_signature(src, ffi::TAG_P2P_SIGNATURE, comm)?;
    active.post(comm, 0, (0, 0))
}

impl Engine {
    /// A receive got what it expected: the sender's dtype and shape, and
    /// as many bytes as the tensor holds.
    pub(super) fn received_as_expected(&self, c: usize, active: &Active) -> Result<(), DistError> {
        let Action::Recv { into, src } = &active.job.action else { return Ok(()) };
        let mismatch =
            |detail| DistError::Mismatch { rank: self.world_rank, op: active.job.name.clone(), detail };
        let src = self.comms[c].global[*src];
        let mine = String::from_utf8_lossy(&active.own_signature).into_owned();
        if let Some((_, theirs)) = active.first_difference(&active.own_signature) {
            let me = self.world_rank;
            return Err(mismatch(format!("rank {src} sent {theirs} but rank {me} receives into {mine}")));
        }
        match active.received {
            Some(bytes) if bytes != byte_len(into) => {
                let (me, want) = (self.world_rank, byte_len(into));
                Err(mismatch(format!(
                    "rank {src} sent {bytes} bytes but rank {me} receives into {mine} ({want} bytes)"
                )))
            }
            _ => Ok(()),
        }
    }
}
