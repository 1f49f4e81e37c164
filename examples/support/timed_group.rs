//! A process group that notes when each of
//! its asynchronous all-reduces completed, for `bench_overlap --timeline`
//! (`cargo run --release --example bench_overlap -- --timeline`). Included
//! with `#[path = "support/timed_group.rs"] mod timed_group;`; the group
//! itself is the tests' forwarding group with a replaced all-reduce
//! (tests/common/forwarding.rs), included here.
//!
//! Why a watcher thread: a backend's `Work` says nothing until it is waited
//! on, and the overlapped driver waits only after backward, so the time its
//! wait returns is not when the all-reduce ended. Here one thread per rank
//! waits on each all-reduce as soon as it is launched, in launch order (the
//! in-process backend runs a rank's all-reduces one after another, in that
//! order, so waiting in order loses nothing), and notes the moment; the
//! `Work` handed back waits for that thread's word.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ddp_workbook::dist::{DistError, Group, ReduceOp, Work};
use ddp_workbook::tch::Tensor;

#[allow(dead_code)] // the fn-pointer alias is the tests' own
#[path = "../../tests/common/forwarding.rs"]
mod forwarding;
use forwarding::{Forwarding, ReplaceAllReduce};

/// An all-reduce for the watcher: its number since the last
/// [`Watcher::restart`], its real handle, and where to send the result.
type Watched = (usize, Work, Sender<Result<(), DistError>>);

/// One rank's watcher: numbers the all-reduces and notes their completions.
pub struct Watcher {
    to_thread: Mutex<Sender<Watched>>,
    launched: Mutex<usize>,
    /// (number, completion time) of each all-reduce since the last restart.
    completions: Arc<Mutex<Vec<(usize, Instant)>>>,
}

/// `inner`, with every asynchronous all-reduce watched; and its watcher.
pub fn timed_group(inner: Group) -> (Group, Arc<Watcher>) {
    let (to_thread, watched) = channel::<Watched>();
    let completions = Arc::new(Mutex::new(vec![]));
    let noted = completions.clone();
    std::thread::spawn(move || watch(watched, noted));
    let watcher =
        Arc::new(Watcher { to_thread: Mutex::new(to_thread), launched: Mutex::new(0), completions });
    let watching = watcher.clone();
    let all_reduce_async =
        move |inner: &Group, tensor: &Tensor, op: ReduceOp| watching.launch(inner, tensor, op);
    let intercept = ReplaceAllReduce(all_reduce_async);
    let group: Group = Arc::new(Forwarding { inner, name: "in-process, timed", intercept });
    (group, watcher)
}

impl Watcher {
    /// Forgets what completed so far and numbers the next all-reduce 0.
    pub fn restart(&self) {
        *self.launched.lock().expect("launch counter") = 0;
        self.completions.lock().expect("completions").clear();
    }

    /// When the all-reduce numbered `n` (from the last restart) completed.
    pub fn completed(&self, n: usize) -> Option<Instant> {
        let completions = self.completions.lock().expect("completions");
        completions.iter().find(|(number, _)| *number == n).map(|(_, at)| *at)
    }

    /// The real all-reduce, handed to the watcher thread.
    fn launch(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        let work = inner.all_reduce_async(tensor, op)?;
        let number = {
            let mut launched = self.launched.lock().expect("launch counter");
            *launched += 1;
            *launched - 1
        };
        let (reply, result) = channel();
        let gone = || DistError::Invalid {
            rank: inner.rank(),
            op: "all_reduce".into(),
            detail: "the timeline's watcher thread has stopped".into(),
        };
        self.to_thread.lock().expect("watcher").send((number, work, reply)).map_err(|_| gone())?;
        let gone = gone();
        Ok(Work::new(move || result.recv().unwrap_or(Err(gone))))
    }
}

/// The watcher thread: waits on each all-reduce in launch order and notes
/// when it ended. It ends when its rank's group is dropped.
fn watch(watched: Receiver<Watched>, completions: Arc<Mutex<Vec<(usize, Instant)>>>) {
    for (number, work, reply) in watched {
        let result = work.wait();
        completions.lock().expect("completions").push((number, Instant::now()));
        let _ = reply.send(result); // the caller may have dropped its handle
    }
}
