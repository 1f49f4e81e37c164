//! A standing in-process group: the handles of one group's ranks, for a
//! caller that runs the rank threads itself and keeps them for many pieces
//! of work (the notebooks' `World`, whose threads outlive a cell), where
//! `spawn` starts and ends its threads around one closure. The meeting
//! place, deadlines and "a rank left" errors are `spawn`'s own (`world.rs`).
//!
//! Try it: `cargo test --test notebook_world`.

use std::sync::Arc;
use std::time::Duration;

use super::group::LocalProcessGroup;
use super::spawn::{SpawnError, SpawnOptions};
use super::world::World;
use crate::dist::Group;

/// One rank handle per rank of a fresh in-process group. Nobody leaves it
/// on their own: call [`leave`](Self::leave) when a rank fails (its peers'
/// calls then fail at once, naming it) and for every rank when the group is
/// done with, so that anything still holding a handle fails promptly.
pub struct StandingGroup {
    world: Arc<World>,
    ranks: Vec<Group>,
}

impl StandingGroup {
    /// A group of `options.world_size` ranks, with the options' timeout,
    /// link and all-reduce scheme (checked as [`spawn_with`](super::spawn_with) checks them).
    pub fn new(options: &SpawnOptions) -> Result<Self, SpawnError> {
        let world = options.world()?;
        let ranks = (0..options.world_size)
            .map(|rank| Arc::new(LocalProcessGroup::new(rank, world.clone())) as Group)
            .collect();
        Ok(StandingGroup { world, ranks })
    }

    /// Rank `rank`'s handle; the same handle every time, so that its calls
    /// stay numbered in order from one piece of work to the next.
    pub fn rank(&self, rank: usize) -> Group {
        self.ranks[rank].clone()
    }

    /// How long any call waits for its peers.
    pub fn timeout(&self) -> Duration {
        self.world.timeout
    }

    /// `rank` has left for `reason` (it failed, or the group is retired):
    /// every call still waiting for it, now or later, fails naming it. The
    /// first reason given for a rank stays.
    pub fn leave(&self, rank: usize, reason: String) {
        self.world.leave(rank, reason);
    }
}
