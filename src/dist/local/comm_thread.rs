//! One rank's communication thread in the in-process backend, as gloo and
//! NCCL keep threads of their own: `all_reduce_async` hands its work here
//! and returns, so the all-reduce (and its simulated link time, if any)
//! progresses while the rank goes on computing. Jobs run in the order they
//! were handed over.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

type Job = Box<dyn FnOnce() + Send>;

pub(super) struct CommThread {
    jobs: Mutex<Sender<Job>>,
}

impl CommThread {
    /// Starts the thread; it ends when this handle is dropped and its jobs are done.
    pub fn start(name: String) -> std::io::Result<Self> {
        let (jobs, inbox) = channel::<Job>();
        std::thread::Builder::new().name(name).spawn(move || {
            for job in inbox {
                // A job reports its own failures; a panic must not take the
                // thread, and the later jobs, with it.
                _ = catch_unwind(AssertUnwindSafe(job));
            }
        })?;
        Ok(CommThread { jobs: Mutex::new(jobs) })
    }

    /// Queues `job`; false if the thread is gone.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).send(Box::new(job)).is_ok()
    }
}
