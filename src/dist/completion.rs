//! Where a call's result waits for its caller: set once by the thread that
//! did the work (a backend's communication thread), taken once by the
//! caller's `wait`. Shared by the in-process and the MPI backends.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::DistError;

pub(crate) struct Completion<T> {
    result: Mutex<Option<Result<T, DistError>>>,
    ready: Condvar,
}

impl<T> Default for Completion<T> {
    fn default() -> Self {
        Completion { result: Mutex::new(None), ready: Condvar::new() }
    }
}

impl<T> Completion<T> {
    pub fn set(&self, result: Result<T, DistError>) {
        *self.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        self.ready.notify_all();
    }

    /// Waits for the result. The worker enforces the call's own deadline;
    /// the `backstop` only guards against a worker thread that died.
    pub fn wait(&self, backstop: Duration, rank: usize, op: &str) -> Result<T, DistError> {
        let deadline = Instant::now() + backstop;
        let mut result = self.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(result) = result.take() {
                return result;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let cause = "the communication thread stopped answering".to_string();
                return Err(DistError::Broken { rank, op: op.to_string(), cause });
            }
            result = self.ready.wait_timeout(result, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}
