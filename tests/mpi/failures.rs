//! No failure leaves an MPI job hanging. A rank that
//! stalls, panics, returns an error or is killed ends the whole job within
//! the deadline plus a few seconds, and the output names that rank. Ranks
//! that disagree on a call get a `Mismatch` naming both calls, and the group
//! still works afterwards (the signatures are compared before any data moves).

use std::time::Duration;

use ddp_workbook::dist::{tagged, DistError, ProcessGroup, ReduceOp};
use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::harness::{launch, on_ranks, Job};

/// Starting mpirun and two test binaries takes a second or two here.
const START_UP: Duration = Duration::from_secs(10);

fn ones(n: i64) -> Tensor {
    Tensor::ones([n], (Kind::Float, Device::Cpu))
}

fn assert_ended(job: &Job, within: Duration, says: &[&str]) {
    assert!(!job.success, "the job should have failed; output:\n{}", job.output);
    assert!(
        job.elapsed < within,
        "the job took {:?} to end (limit {within:?}); output:\n{}",
        job.elapsed,
        job.output
    );
    for words in says {
        assert!(job.output.contains(words), "the output should say {words:?}; it is:\n{}", job.output);
    }
}

/// A job whose rank 1 never reached the call (deadline 3 s) ended at the
/// deadline, not before, saying `says`.
fn assert_ended_at_the_deadline(job: &Job, says: &[&str]) {
    assert_ended(job, Duration::from_secs(3) + START_UP, says);
    assert!(job.elapsed >= Duration::from_secs(3), "ended before the deadline: {:?}", job.elapsed);
}

#[test]
fn a_stalled_rank_ends_the_job_at_the_deadline_naming_it() {
    let name = "failures::a_stalled_rank_ends_the_job_at_the_deadline_naming_it";
    let Some(job) = launch(2, name, &[("DDP_TIMEOUT_SECS", "3")], |pg| {
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(120)); // stuck before the call
        }
        let mut t = ones(4);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(())
    }) else {
        return;
    };
    let says = ["rank 0 of 2 failed", "waiting for rank(s) [1]", "all_reduce(sum) of Float[4] (call #0)"];
    assert_ended_at_the_deadline(&job, &says);
}

// In place in shared memory (`alloc_buffer`), with no signature exchange
// before it: the first sync of the call itself must keep the deadline.
#[test]
fn a_stalled_rank_ends_an_all_reduce_in_shared_memory_at_the_deadline_naming_it() {
    let name = "failures::a_stalled_rank_ends_an_all_reduce_in_shared_memory_at_the_deadline_naming_it";
    let env = [("DDP_TIMEOUT_SECS", "3"), ("DDP_DEBUG", "off")];
    let Some(job) = launch(2, name, &env, |pg| {
        let mut t = pg.alloc_buffer(4, Kind::Float, Device::Cpu)?;
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(120)); // stuck before the call
        }
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(())
    }) else {
        return;
    };
    let says = ["rank 0 of 2 failed", "waiting for rank(s) [1]", "all_reduce(sum) of Float[4] (call #1)"];
    assert_ended_at_the_deadline(&job, &says);
}

#[test]
fn a_panicking_rank_ends_the_job_at_once_naming_it() {
    let name = "failures::a_panicking_rank_ends_the_job_at_once_naming_it";
    let Some(job) = launch(2, name, &[("DDP_TIMEOUT_SECS", "60")], |pg| {
        if pg.rank() == 1 {
            panic!("a deliberate panic on rank 1");
        }
        let mut t = ones(4);
        pg.all_reduce(&mut t, ReduceOp::Sum)?; // rank 0 waits here, not for 60 s
        Ok(())
    }) else {
        return;
    };
    assert_ended(&job, START_UP, &["rank 1 of 2 failed", "panicked: a deliberate panic on rank 1"]);
}

#[test]
fn a_rank_returning_an_error_ends_the_job_at_once_naming_it() {
    let name = "failures::a_rank_returning_an_error_ends_the_job_at_once_naming_it";
    let Some(job) = launch(3, name, &[("DDP_TIMEOUT_SECS", "60")], |pg| {
        if pg.rank() == 2 {
            anyhow::bail!("a deliberate error on rank 2");
        }
        pg.barrier()?;
        Ok(())
    }) else {
        return;
    };
    assert_ended(&job, START_UP, &["rank 2 of 3 failed", "returned an error: a deliberate error on rank 2"]);
}

#[test]
fn a_killed_rank_ends_the_job_at_once_naming_it() {
    let name = "failures::a_killed_rank_ends_the_job_at_once_naming_it";
    let Some(job) = launch(2, name, &[("DDP_TIMEOUT_SECS", "60")], |pg| {
        if pg.rank() == 1 {
            let pid = std::process::id().to_string();
            std::process::Command::new("kill").args(["-9", &pid]).status()?;
            std::thread::sleep(Duration::from_secs(60)); // the signal arrives first
        }
        let mut t = ones(4);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(())
    }) else {
        return;
    };
    // mpirun's own words: "mpirun noticed that process rank 1 with PID ... exited on signal 9 (Killed)".
    assert_ended(&job, START_UP, &["process rank 1", "signal 9"]);
}

/// `call` on each rank must fail with a Mismatch whose words include `says`.
fn expect_mismatch(
    pg: &dyn ProcessGroup,
    says: &[&str],
    call: impl FnOnce() -> Result<(), DistError>,
) -> anyhow::Result<()> {
    match call() {
        Err(error @ DistError::Mismatch { .. }) => {
            let text = error.to_string();
            for words in says {
                anyhow::ensure!(text.contains(words), "rank {}: {text:?} should say {words:?}", pg.rank());
            }
            Ok(())
        }
        other => anyhow::bail!("rank {}: expected a Mismatch, got {other:?}", pg.rank()),
    }
}

#[test]
fn ranks_that_disagree_get_a_mismatch_naming_both_calls_and_the_group_still_works() {
    let name = "failures::ranks_that_disagree_get_a_mismatch_naming_both_calls_and_the_group_still_works";
    on_ranks(2, name, |pg| {
        let first = pg.rank() == 0;
        // Shapes.
        let mut t = ones(if first { 4 } else { 5 });
        expect_mismatch(
            pg.as_ref(),
            &[
                "rank 0 called all_reduce(sum) of Float[4]",
                "rank 1 called all_reduce(sum) of Float[5]",
                "call #0",
            ],
            || pg.all_reduce(&mut t, ReduceOp::Sum),
        )?;
        // Operations.
        let mut t = ones(3);
        expect_mismatch(
            pg.as_ref(),
            &["broadcast(root=0) of Float[3]", "all_reduce(max) of Float[3]"],
            || {
                if first {
                    pg.broadcast(&mut t, 0)
                } else {
                    pg.all_reduce(&mut t, ReduceOp::Max)
                }
            },
        )?;
        // Roots, dtypes and tags.
        let mut t = ones(3);
        expect_mismatch(pg.as_ref(), &["root=0", "root=1"], || pg.broadcast(&mut t, pg.rank()))?;
        let mut t = ones(3).to_kind(if first { Kind::Float } else { Kind::Double });
        expect_mismatch(pg.as_ref(), &["of Float[3]", "of Double[3]"], || {
            pg.all_reduce(&mut t, ReduceOp::Sum)
        })?;
        let mut t = ones(3);
        let tag = if first { "bucket 0" } else { "bucket 1" };
        expect_mismatch(pg.as_ref(), &["tagged \"bucket 0\"", "tagged \"bucket 1\""], || {
            tagged(tag, || pg.all_reduce(&mut t, ReduceOp::Sum))
        })?;
        // Point to point: the receiver's dtype differs from the sender's. The
        // refused message must not land in the receiver's tensor (its 12
        // bytes fit in the 24 of Int64[3]).
        if first {
            pg.send(&ones(3), 1)?;
        } else {
            let mut into = Tensor::full([3], 7, (Kind::Int64, Device::Cpu));
            expect_mismatch(
                pg.as_ref(),
                &["rank 0 sent Float[3] but rank 1 receives into Int64[3]"],
                || pg.recv(&mut into, 0),
            )?;
            let untouched = into.equal(&Tensor::full([3], 7, (Kind::Int64, Device::Cpu)));
            anyhow::ensure!(untouched, "a refused message was written into the receiver's tensor: {into:?}");
        }
        // Nothing moved: the communicator is intact.
        let mut t = ones(2);
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        anyhow::ensure!(t.equal(&(ones(2) * 2)), "after the mismatches the sum is {t:?}");
        Ok(())
    });
}

/// A receive that fails after its signature receive was posted (here: a
/// tensor of 2^31 bytes, one more than an MPI message can count, sent as
/// one message because the test lifts the backend's cut into pieces)
/// reports why, and keeps its buffers until the job ends: it is not
/// judged, as a mismatch, on a signature that never arrived.
#[test]
fn a_failed_receive_says_why_instead_of_judging_a_signature_that_never_came() {
    let name = "failures::a_failed_receive_says_why_instead_of_judging_a_signature_that_never_came";
    let env = [("DDP_TIMEOUT_SECS", "60"), ("DDP_MPI_MOST_PER_CALL", "4294967296")];
    let Some(job) = launch(2, name, &env, |pg| {
        if pg.rank() == 0 {
            // Not touched, so not really allocated: 2 GiB of address space.
            let mut huge = Tensor::empty([1i64 << 31], (Kind::Uint8, Device::Cpu));
            let error = pg.recv(&mut huge, 1).expect_err("MPI cannot carry 2^31 bytes in one message");
            println!("the receive failed: {error}");
        }
        Ok(()) // rank 0's group is broken: it cannot finish, and ends the job
    }) else {
        return;
    };
    assert_ended(&job, START_UP, &["the receive failed: ", "more than one MPI message can carry"]);
    assert!(!job.output.contains("rank 1 sent"), "judged on a signature rank 1 never sent:\n{}", job.output);
}
