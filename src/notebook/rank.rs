//! What a closure given to the notebook's `World` works with on one rank:
//! [`Rank`], its number, its group, where it writes what the cell shows,
//! and the values it keeps from one cell to the next, by name; and
//! [`KeptError`], the error of asking for a value it does not keep. Part of
//! `src/notebook.rs`; tested by `cargo test --test notebook_world`.

use std::any::{type_name, Any};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::quiet::lock;
use crate::dist::Group;

/// What a rank may keep: a value that can move to the rank's thread and
/// live there after the cell that made it has ended, so `Send + 'static`
/// (a `Tensor`, a `VarStore`, a model, an optimizer, `Vec`s and structs of
/// them). Every such type has it; nothing to implement. For any other,
/// the compiler says so in these words:
///
/// ```compile_fail,E0277
/// # use ddp_workbook::notebook::World;
/// let world = World::start(2)?;
/// // error: a rank cannot keep a `Rc<i32>`: a kept value must be `Send + 'static`
/// world.run(|rank| Ok(rank.keep("shared", std::rc::Rc::new(1))))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[diagnostic::on_unimplemented(
    message = "a rank cannot keep a `{Self}`: a kept value must be `Send + 'static`",
    label = "this value cannot move to the rank's thread, or borrows from the cell",
    note = "keep owned values that hold no `Rc`, `RefCell` borrow or reference: a Tensor, a VarStore, a \
            model, a Vec or a struct of them (notebooks/README.md, \"What a rank can keep\")"
)]
pub trait Keepable: Any + Send {}

impl<T: Any + Send> Keepable for T {}

/// One kept value, and the name of its type for messages.
struct Kept {
    value: Box<dyn Any + Send>,
    type_name: &'static str,
}

/// Where one rank writes what the cell shows under its `── Rank N ──`
/// heading: `writeln!(rank, ...)`, or, while a kept value is borrowed from
/// the rank, `let out = rank.out();` first and `writeln!(out, ...)`.
#[derive(Clone)]
pub struct RankOut {
    buffer: Arc<Mutex<String>>,
}

impl RankOut {
    pub(super) fn new() -> Self {
        RankOut { buffer: Arc::new(Mutex::new(String::new())) }
    }

    /// What `write!` and `writeln!` call (no `use std::fmt::Write` needed).
    pub fn write_fmt(&self, args: fmt::Arguments<'_>) -> fmt::Result {
        fmt::Write::write_fmt(&mut *lock(&self.buffer), args)
    }

    pub(super) fn text(&self) -> String {
        lock(&self.buffer).clone()
    }
}

/// One rank of a notebook's [`World`](super::World), as a cell's closure
/// sees it: `world.run(|rank| { ... })`. It lives as long as the world, so
/// what it keeps stays for the next cells.
pub struct Rank {
    rank: usize,
    world_size: usize,
    pg: Group,
    out: RankOut,
    kept: BTreeMap<String, Kept>,
}

impl Rank {
    pub(super) fn new(rank: usize, world_size: usize, pg: Group) -> Self {
        Rank { rank, world_size, pg, out: RankOut::new(), kept: BTreeMap::new() }
    }

    /// Sets what the next cell uses: the group (a new one after a failed
    /// cell) and where its output goes.
    pub(super) fn begin_cell(&mut self, pg: Group, out: RankOut) {
        self.pg = pg;
        self.out = out;
    }

    /// This rank's number, 0 to `world_size() - 1`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the world has.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This rank's process group: `rank.pg().all_reduce(&mut t, ReduceOp::Sum)?`.
    /// The same group from cell to cell, until a cell fails: the world then
    /// makes a new one, and what holds the old one must be built again.
    pub fn pg(&self) -> &Group {
        &self.pg
    }

    /// What `writeln!(rank, ...)` calls: the line goes under this rank's heading.
    pub fn write_fmt(&self, args: fmt::Arguments<'_>) -> fmt::Result {
        self.out.write_fmt(args)
    }

    /// A handle on this cell's output, to write while a kept value is
    /// borrowed mutably (`get_mut`).
    pub fn out(&self) -> RankOut {
        self.out.clone()
    }

    /// Keeps `value` under `key` until a later cell takes it or the world
    /// ends; a value already kept under `key` is dropped.
    pub fn keep<T: Keepable>(&mut self, key: &str, value: T) {
        let kept = Kept { value: Box::new(value), type_name: type_name::<T>() };
        self.kept.insert(key.to_string(), kept);
    }

    /// The value kept under `key`, if it is a `T`.
    pub fn get<T: Any>(&self, key: &str) -> Result<&T, KeptError> {
        let error = self.error::<T>(key);
        let kept = self.kept.get(key).ok_or_else(error)?;
        kept.value.downcast_ref::<T>().ok_or_else(self.error::<T>(key))
    }

    /// The value kept under `key`, to change in place, if it is a `T`.
    pub fn get_mut<T: Any>(&mut self, key: &str) -> Result<&mut T, KeptError> {
        let error = self.error::<T>(key)();
        match self.kept.get_mut(key).map(|kept| kept.value.downcast_mut::<T>()) {
            Some(Some(value)) => Ok(value),
            _ => Err(error),
        }
    }

    /// Takes the value kept under `key` away from the rank, if it is a `T`
    /// (a value of another type stays kept).
    pub fn take<T: Any>(&mut self, key: &str) -> Result<T, KeptError> {
        let error = self.error::<T>(key)();
        match self.kept.get(key) {
            Some(kept) if kept.value.is::<T>() => {}
            _ => return Err(error),
        }
        let kept = self.kept.remove(key).expect("checked just above");
        Ok(*kept.value.downcast::<T>().expect("checked just above"))
    }

    /// What this rank keeps: each name and the type of its value.
    pub fn kept(&self) -> Vec<(String, String)> {
        self.kept.iter().map(|(key, kept)| (key.clone(), short_type_name(kept.type_name))).collect()
    }

    /// The error for asking `key` as a `T`, made lazily.
    fn error<T: Any>(&self, key: &str) -> impl FnOnce() -> KeptError + '_ {
        let key = key.to_string();
        move || {
            let found = match self.kept.get(&key) {
                Some(kept) => Found::OtherType(short_type_name(kept.type_name)),
                None => Found::Missing(self.kept().into_iter().map(|(key, _)| key).collect()),
            };
            KeptError { rank: self.rank, key, wanted: short_type_name(type_name::<T>()), found }
        }
    }
}

/// Why [`Rank::get`], [`Rank::get_mut`] or [`Rank::take`] found no value.
#[derive(Debug)]
pub struct KeptError {
    pub rank: usize,
    pub key: String,
    /// The type asked for.
    pub wanted: String,
    pub found: Found,
}

/// What the rank keeps instead.
#[derive(Debug)]
pub enum Found {
    /// Nothing under the key; these are the keys it does keep.
    Missing(Vec<String>),
    /// A value of this other type.
    OtherType(String),
}

impl fmt::Display for KeptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let KeptError { rank, key, wanted, found } = self;
        match found {
            Found::Missing(keys) => {
                let keeps = if keys.is_empty() {
                    "it keeps nothing yet".to_string()
                } else {
                    format!(
                        "it keeps {}",
                        keys.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
                    )
                };
                write!(
                    f,
                    "rank {rank} keeps no {wanted} named {key:?} ({keeps}): keep it first, with \
                     rank.keep({key:?}, value) in an earlier cell on this rank (was that cell run, and \
                     on rank {rank}? or was it taken with rank.take?)"
                )
            }
            Found::OtherType(other) => write!(
                f,
                "rank {rank} keeps {key:?} as a {other}, not a {wanted}: ask for \
                 rank.get::<{other}>({key:?}), or keep a {wanted} under another name"
            ),
        }
    }
}

impl std::error::Error for KeptError {}

/// A type's name without its module paths, generic arguments included:
/// `alloc::vec::Vec<tch::wrapped_tensor::Tensor>` becomes `Vec<Tensor>`.
pub(super) fn short_type_name(full: &str) -> String {
    let mut short = String::with_capacity(full.len());
    let mut word = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            short.push_str(word.rsplit("::").next().unwrap_or(&word));
            word.clear();
            short.push(c);
        }
    }
    short.push_str(word.rsplit("::").next().unwrap_or(&word));
    short
}
