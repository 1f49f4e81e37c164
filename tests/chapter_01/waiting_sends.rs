//! Chapter 01 tests, a ring on a backend whose `send` waits: the in-process
//! `send` is buffered and returns at once, but MPI's `MPI_Ssend` (and, in
//! practice, `MPI_Send` of a large message) returns only once the receiver
//! has posted the matching receive. Your ring must finish there too. Which
//! rank sends first and which receives first in each step is yours to
//! decide; this test holds you to a decision that cannot deadlock.
//!
//! Compiled into `cargo test --test chapter_01` (see `tests/chapter_01.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ddp_workbook::ch01_collectives::ring_all_reduce;
use ddp_workbook::dist::{spawn_with, DistError, Group, ProcessGroup};
use ddp_workbook::tch::Tensor;

use super::forwarding::{Forwarding, Intercept};
use super::{describe, integer_valued_f32, options, values, WORLD_SIZES};

/// How long a waiting send waits for its receive before it gives up: long
/// enough for any ring that can finish, short enough to fail a deadlock soon.
const SEND_DEADLINE: Duration = Duration::from_secs(3);
/// What a deadlocked send's error says, so that the test can tell it apart.
const STUCK: &str = "a send that waits for its receive";

/// Per (sender, receiver): how many sends it has started and how many
/// receives the receiver has posted. Shared by the ranks of one world.
#[derive(Default)]
struct Rendezvous {
    counts: Mutex<HashMap<(usize, usize), (u64, u64)>>,
    changed: Condvar,
}

/// What makes a rank's [`Forwarding`] group's `send` return only once the
/// receiver has called the matching `recv`; every other call goes to the
/// real group.
struct SendsWaitForReceives(Arc<Rendezvous>);

impl Intercept for SendsWaitForReceives {
    fn send(&self, inner: &Group, tensor: &Tensor, dst: usize) -> Result<(), DistError> {
        inner.send(tensor, dst)?; // the message is on its way; now wait for its receive
        let link = (inner.rank(), dst);
        let mut counts = self.0.counts.lock().unwrap();
        let entry = counts.entry(link).or_default();
        entry.0 += 1;
        let nth = entry.0;
        let start = Instant::now();
        while counts[&link].1 < nth {
            let left = SEND_DEADLINE.saturating_sub(start.elapsed());
            if left.is_zero() {
                let op = format!("send #{nth} to rank {dst}, {STUCK}");
                return Err(DistError::Timeout {
                    rank: inner.rank(),
                    op,
                    missing: vec![dst],
                    waited: start.elapsed(),
                });
            }
            counts = self.0.changed.wait_timeout(counts, left).unwrap().0;
        }
        Ok(())
    }
    fn recv(&self, inner: &Group, tensor: &mut Tensor, src: usize) -> Result<(), DistError> {
        {
            let mut counts = self.0.counts.lock().unwrap();
            counts.entry((src, inner.rank())).or_default().1 += 1; // the receive is posted
            self.0.changed.notify_all();
        }
        inner.recv(tensor, src)
    }
}

#[test]
fn the_ring_finishes_where_a_send_waits_for_its_receive() {
    let shape = [13_i64];
    for world_size in WORLD_SIZES {
        let case = format!(
            "{}, sends that wait for their receive",
            describe(world_size, &shape, integer_valued_f32(0, &shape).kind())
        );
        let rendezvous = Arc::new(Rendezvous::default());
        let outcome = spawn_with(options(world_size), |group| {
            let intercept = SendsWaitForReceives(rendezvous.clone());
            let pg = Forwarding { inner: group, name: "waiting-sends", intercept };
            let mut t = integer_valued_f32(pg.rank(), &shape);
            ring_all_reduce(&pg, &mut t)?;
            values(&t)
        });
        let sums = outcome.unwrap_or_else(|error| {
            let message = error.to_string();
            if message.contains(STUCK) {
                panic!(
                    "{case}: your ring never finished: {message}\n  Every rank was waiting in `send` for a \
                     receive that no rank had posted. On such a backend the order of `send` and `recv` \
                     within a step decides whether the ring moves at all: choose one in which, in every \
                     step, some rank's receive is already posted when its neighbour sends."
                )
            }
            panic!("{case}: {message}")
        });
        let expected: Vec<f64> = (0..world_size)
            .map(|rank| values(&integer_valued_f32(rank, &shape)).unwrap())
            .fold(vec![0.0; 13], |sum, v| sum.iter().zip(&v).map(|(a, b)| a + b).collect());
        for (rank, got) in sums.iter().enumerate() {
            assert_eq!(got, &expected, "{case}: rank {rank}'s ring result is not the sum over all ranks");
        }
    }
}
