//! The checkpoint file is rank 0's alone. Rank 0
//! checks it and reads it; the other ranks get its verdict and its bytes
//! through the process group (one broadcast of a status and a length, one
//! of the bytes), so a resumed job needs no file system shared between its
//! machines: the ranks on other nodes never open the file. Rank 0 is also
//! the only rank that writes checkpoints, so only it checks that it can.

use std::path::Path;

use anyhow::anyhow;
use tch::{Kind, Tensor};

use super::checkpoint::{self, Checkpoint};
use super::config::TrainConfig;
use crate::dist::ProcessGroup;

// ANCHOR: from_rank0
/// Rank 0's `work` (its bytes, or why it failed), on every rank: every rank
/// returns the same bytes or the same error. `work` runs on rank 0 only.
fn from_rank0(
    pg: &dyn ProcessGroup,
    work: impl FnOnce() -> Result<Vec<u8>, String>,
) -> anyhow::Result<Vec<u8>> {
    let result = if pg.rank() == 0 { Some(work()) } else { None };
    let (failed, sent) = match &result {
        Some(Ok(bytes)) => (0, bytes.as_slice()),
        Some(Err(why)) => (1, why.as_bytes()),
        None => (0, &[][..]),
    };
    let mut header = Tensor::from_slice(&[failed, sent.len() as i64]); // [failed, bytes]
    pg.broadcast(&mut header, 0)?;
    let (failed, len) = (header.int64_value(&[0]) == 1, header.int64_value(&[1]));
    if len == 0 {
        return Ok(Vec::new()); // a verdict without bytes: nothing more to send
    }
    let mut payload = match pg.rank() {
        0 => Tensor::from_slice(sent),
        _ => Tensor::zeros([len], (Kind::Uint8, tch::Device::Cpu)),
    };
    pg.broadcast(&mut payload, 0)?;
    let bytes = Vec::<u8>::try_from(&payload).map_err(|e| anyhow!("rank {}: {e}", pg.rank()))?;
    if failed {
        return Err(anyhow!("{}", String::from_utf8_lossy(&bytes)));
    }
    Ok(bytes)
}
// ANCHOR_END: from_rank0

/// The checkpoint to resume from, on every rank: rank 0 reads `path` once
/// and checks that it fits `config` (intact, same settings, not past the
/// end); the others receive its bytes and check the checksum again, which
/// also catches bytes damaged on the way.
pub(super) fn load_on_rank0(
    pg: &dyn ProcessGroup,
    path: &Path,
    config: &TrainConfig,
) -> anyhow::Result<Checkpoint> {
    let mut read_here = None;
    let bytes = from_rank0(pg, || {
        let (saved, bytes) = checkpoint::read(path).map_err(|e| e.to_string())?;
        config.fits(&saved, path).map_err(|e| e.to_string())?;
        read_here = Some(saved);
        Ok(bytes)
    })?;
    match read_here {
        Some(saved) => Ok(saved),
        None => Ok(checkpoint::from_bytes(path, &bytes)?),
    }
}

/// [`TrainConfig::validate`] for a rank of a launched job: the settings on
/// every rank, the checkpoint file (there on `--resume`, writable) on rank 0
/// only, whose verdict every rank returns. Its contents are read and
/// checked once, by [`load_on_rank0`], before the first step.
pub(super) fn validate_as_process(pg: &dyn ProcessGroup, config: &TrainConfig) -> anyhow::Result<()> {
    let settings_only =
        TrainConfig { checkpoint: None, checkpoint_every: 0, resume: false, ..config.clone() };
    settings_only.validate()?; // the same settings everywhere: every rank refuses alike
    let checked = || config.validate_reading(false).map(|()| Vec::new()).map_err(|e| e.to_string());
    from_rank0(pg, checked)?;
    Ok(())
}
