//! The two checks that keep a run's replicas honest. Before the first
//! step, every rank's settings must be the ones the others hold: ranks of
//! a launched job parse their own flags, and a rank with another thread
//! count or gradient dtype would round differently and drift away
//! ([`check_settings_agree`]). Before every checkpoint and after the last
//! step, every rank fingerprints the state a checkpoint of it would hold
//! (weights, optimizer state, progress), the ranks all-gather
//! the fingerprints, and the run fails on every rank unless all are equal
//! ([`check_replicas_agree`]): a DDP that skipped a gradient sync would
//! still learn on rank 0, but its replicas would have drifted apart, and a
//! checkpoint of rank 0's state would let a restart resume every rank from
//! it as if they had agreed.

use tch::Tensor;

use super::checkpoint::Setting;

use crate::dist::ProcessGroup;

/// The replicas ended in different states. Every rank gets the same error.
#[derive(Debug, thiserror::Error)]
#[error(
    "the replicas differ after step {step}: the fingerprints of their states are {}. DDP keeps \
     every replica bitwise equal when each gradient is averaged over all ranks before every \
     optimizer step: a gradient sync was skipped, or a rank changed its model or optimizer alone. \
     No checkpoint of this state was written; a restart resumes from the last one the replicas \
     agreed on",
    in_hex(.fingerprints)
)]
pub struct ReplicasDiffer {
    pub step: usize,
    /// Rank r's fingerprint at index r.
    pub fingerprints: Vec<i64>,
}

/// `rank 0 0x…, rank 1 0x…`.
fn in_hex(fingerprints: &[i64]) -> String {
    let each = fingerprints.iter().enumerate().map(|(rank, f)| format!("rank {rank} {f:#018x}"));
    each.collect::<Vec<_>>().join(", ")
}

/// Gathers every rank's `fingerprint` (of its state after `step`) and
/// returns it if all ranks hold the same; otherwise [`ReplicasDiffer`],
/// on every rank alike, so no rank goes on alone.
pub fn check_replicas_agree(pg: &dyn ProcessGroup, fingerprint: i64, step: usize) -> anyhow::Result<i64> {
    let gathered = pg.all_gather(&Tensor::from_slice(&[fingerprint]))?;
    let fingerprints: Vec<i64> = gathered.iter().map(|t| t.int64_value(&[0])).collect();
    if fingerprints.iter().all(|&f| f == fingerprints[0]) {
        Ok(fingerprints[0])
    } else {
        Err(ReplicasDiffer { step, fingerprints }.into())
    }
}

/// The ranks were started with different settings. Every rank gets the same error.
#[derive(Debug, thiserror::Error)]
#[error(
    "the ranks were started with different settings: {}. Each of these changes the numbers, so \
     the replicas would drift apart: start every rank with the same flags{}",
    .differences.join("; "),
    if .differences.iter().any(|d| d.starts_with("threads_per_rank ")) {
        " (--threads sets threads_per_rank; without it each machine's core count does: give it on every rank)"
    } else {
        ""
    }
)]
pub struct SettingsDifferAcrossRanks {
    /// One line per setting: `name is A on rank(s) 0, B on rank(s) 1`.
    pub differences: Vec<String>,
}

/// Gathers every rank's `settings` (as `TrainConfig::settings` lists them)
/// and fails, on every rank alike, naming each setting that differs and
/// the ranks that hold each value, unless all ranks hold the same.
pub fn check_settings_agree(pg: &dyn ProcessGroup, settings: &[(String, Setting)]) -> anyhow::Result<()> {
    let text: String = settings.iter().map(|(name, value)| format!("{name}={value}\n")).collect();
    // Two all-gathers: the lengths, then the texts padded to the longest.
    let lengths = pg.all_gather(&Tensor::from_slice(&[text.len() as i64]))?;
    let longest = lengths.iter().map(|t| t.int64_value(&[0])).max().unwrap_or(0) as usize;
    let mut padded: Vec<i64> = text.bytes().map(i64::from).collect();
    padded.resize(longest, 0);
    let gathered = pg.all_gather(&Tensor::from_slice(&padded))?;
    let per_rank: Vec<Vec<(String, String)>> = gathered
        .iter()
        .zip(&lengths)
        .map(|(bytes, len)| {
            let bytes: Vec<i64> = Vec::try_from(bytes).unwrap_or_default();
            let bytes: Vec<u8> = bytes[..len.int64_value(&[0]) as usize].iter().map(|&b| b as u8).collect();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let pairs = text.lines().filter_map(|line| line.split_once('='));
            pairs.map(|(name, value)| (name.to_string(), value.to_string())).collect()
        })
        .collect();
    let mut names: Vec<&str> = Vec::new();
    for (name, _) in per_rank.iter().flatten() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let mut differences = Vec::new();
    for name in names {
        // Each value, in order of the first rank that holds it, with its ranks.
        let mut values: Vec<(String, Vec<usize>)> = Vec::new();
        for (rank, pairs) in per_rank.iter().enumerate() {
            let value = pairs.iter().find(|(n, _)| n == name).map_or("(none)", |(_, v)| v.as_str());
            match values.iter_mut().find(|(v, _)| v == value) {
                Some((_, ranks)) => ranks.push(rank),
                None => values.push((value.to_string(), vec![rank])),
            }
        }
        if values.len() > 1 {
            let each = values.iter().map(|(value, ranks)| format!("{value} on rank(s) {}", list(ranks)));
            differences.push(format!("{name} is {}", each.collect::<Vec<_>>().join(", ")));
        }
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(SettingsDifferAcrossRanks { differences }.into())
    }
}

/// `0, 2, 3`.
fn list(ranks: &[usize]) -> String {
    ranks.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}
