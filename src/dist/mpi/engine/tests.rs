//! Unit tests of the communication thread (`engine.rs`): when it stops
//! after a failure, the jobs MPI may still write into are kept (never
//! freed) until the caller aborts the job; and a job's deadline counts from
//! when its caller queued it. Nothing here calls MPI: the jobs
//! are put where a failure leaves them, and the thread is told to stop.
//! Whether a job's buffers are freed is seen on its `Done`, which the job
//! holds as long as it lives.
//!
//! Run: `cargo test --features mpi --lib dist::mpi`

use std::sync::mpsc::channel;

use tch::{Device, Kind, Tensor};

use super::*;
use crate::dist::ReduceOp;

/// A communicator handle that is never used: these tests make no MPI call.
fn unused_comm() -> Comm {
    // SAFETY: reads a constant of the MPI library; MPI need not be initialized.
    unsafe { mpi::ffi::RSMPI_COMM_NULL }
}

/// An all-reduce job on a fresh buffer, and its `Done`, shared with the job.
fn all_reduce_job() -> (Job, Arc<Done>) {
    let buf = Tensor::zeros([1024], (Kind::Float, Device::Cpu));
    let done = Arc::new(Done::default());
    let action = Action::AllReduce { buf, op: ReduceOp::Sum };
    let job = Job {
        comm: 0,
        action,
        name: "all_reduce(sum) of Float[1024] (call #0)".into(),
        signature: None,
        done: done.clone(),
        queued: Instant::now(),
    };
    (job, done)
}

/// Runs the thread until it has handled a shutdown; returns the shutdown's result.
fn shut_down(engine: Engine) -> Result<Reply, DistError> {
    let (commands, inbox) = channel();
    let shutdown = Arc::new(Done::default());
    commands.send(Command::Shutdown(shutdown.clone())).expect("the inbox is open");
    engine.run(inbox);
    shutdown.wait(Duration::from_secs(1), 0, "the test's shutdown")
}

#[test]
fn a_broken_engine_keeps_the_failed_jobs_buffers_past_its_end() {
    let mut engine = Engine::new(unused_comm(), 0, 2, Duration::from_secs(60));
    let (job, done) = all_reduce_job();
    let error = DistError::Broken { rank: 0, op: job.name.clone(), cause: "a deliberate failure".into() };
    engine.break_all(Active::new(job, Duration::from_secs(60)), error, "a deliberate failure".into());
    let result = shut_down(engine);
    assert!(matches!(result, Err(DistError::Broken { .. })), "a broken engine ends with an error");
    assert!(done.wait(Duration::from_secs(1), 0, "the job").is_err(), "the failed job's caller got an error");
    assert_eq!(
        Arc::strong_count(&done),
        2,
        "the failed job (and with it the buffer MPI may still write into) was freed when the thread \
         ended, before the caller could abort the job"
    );
}

#[test]
fn a_call_still_in_flight_at_the_shutdown_deadline_keeps_its_buffers() {
    // A zero timeout: the shutdown's deadline has passed as soon as it comes.
    let mut engine = Engine::new(unused_comm(), 0, 2, Duration::ZERO);
    let (job, done) = all_reduce_job();
    engine.accept(job); // queued: a collective waits for the thread's next round
    let result = shut_down(engine);
    let error = result.err().expect("a call never finished: the shutdown fails").to_string();
    assert!(error.contains("still in flight") && error.contains("all_reduce(sum)"), "{error}");
    assert_eq!(
        Arc::strong_count(&done),
        2,
        "the unfinished call's buffer was freed when the thread ended, before the caller could abort \
         the job"
    );
}

#[test]
fn a_jobs_deadline_counts_from_when_its_caller_queued_it() {
    // The thread takes the job 5 s after the caller queued it (it was busy):
    // the caller has waited 5 of its 60 s already.
    let mut engine = Engine::new(unused_comm(), 0, 2, Duration::from_secs(60));
    let (mut job, _done) = all_reduce_job();
    let queued = Instant::now() - Duration::from_secs(5);
    job.queued = queued;
    engine.accept(job); // queued: a collective waits for the thread's next round
    let deadline = engine.comms[0].queue[0].deadline;
    assert_eq!(
        deadline,
        queued + Duration::from_secs(60),
        "the deadline must count from the call, not from the thread taking it"
    );
}
