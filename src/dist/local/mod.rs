//! The in-process backend: every rank is a thread of this process, and the
//! ranks of a group meet in memory they share. [`spawn`] starts them; each
//! gets a [`LocalProcessGroup`]. It needs nothing installed, which is why
//! the chapters and their tests run on it.
//!
//! Try it: `cargo test --test dist`.
//!
//! | file | what |
//! | --- | --- |
//! | `spawn.rs` | [`spawn`], [`spawn_with`] and their options: one thread per rank |
//! | `group.rs` | [`LocalProcessGroup`], the `ProcessGroup` every rank calls |
//! | `world.rs` | the state a group's ranks share, who left, sub-groups, the one way to wait |
//! | `rendezvous.rs` | how call number `seq` of every rank meets, and fails together |
//! | `slot.rs` | one call's meeting place and its shared result, computed in rank order |
//! | `scheme.rs` | which all_reduce algorithm a call uses: by size and rank count |
//! | `split_reduce.rs` | the all_reduce that its ranks finish in place, in their own tensors |
//! | `standing.rs` | [`StandingGroup`]: one group's rank handles, for rank threads that outlive one closure (the notebooks' `World`) |
//! | `spin.rs` | how a rank waits: watch briefly, then sleep; counts of each |
//! | `p2p.rs` | `send` and `recv`: mailboxes between two ranks |
//! | `comm_thread.rs` | each rank's communication thread, where `all_reduce_async` progresses |
//! | `link.rs` | [`SimulatedLink`]: a network's cost on one machine |
//!
//! The files the other backends share with this one (the call signature
//! the ranks compare, the completion a caller waits on, the errors, the
//! environment's settings) sit one level up, in `src/dist/`.

mod comm_thread;
mod group;
mod link;
mod p2p;
mod rendezvous;
mod scheme;
mod slot;
mod spawn;
mod spin;
mod split_reduce;
mod standing;
mod world;

pub use group::LocalProcessGroup;
pub use link::SimulatedLink;
pub use scheme::{split_wins, AllReduceScheme, SPLIT_FROM_BYTES};
pub use spawn::{spawn, spawn_with, RankFailure, SpawnError, SpawnOptions};
pub use spin::{wait_counts, WaitCounts};
pub use standing::StandingGroup;
