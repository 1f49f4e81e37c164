//! The part of the `layering` check that finds import
//! circles: two files that each use something of the other
//! (docs/architecture.md: "Inside a layer no two files import each other:
//! a piece that two files need lives in a third that imports neither"). In
//! a circle neither file can be read, tested or moved without the other.
//! Run it: `cargo xtask test --only layering`. Unit tests:
//! xtask/tests/layering_circles.rs.
//!
//! # What counts
//!
//! The module tree is the compiler's: from each crate root (`src/lib.rs`,
//! each example, `xtask/src/{lib,main}.rs`, `bin/*.rs`) down its `mod`
//! declarations, `#[path]` included, so `examples/support/` files are
//! modules of each example that declares them. (A file that no `mod`
//! reaches because a macro declares it, as `figure_modules!` does, is
//! placed where its folder puts it: `examples/figures/ch01_ring.rs` under
//! `examples/figures.rs`; what the macro itself uses cannot be seen.)
//!
//! A file *uses an item of* another when one of its `use` leaves (a group
//! `{a::X, b::Y}` is two, `pub use` re-exports count), or a path in its code
//! starting at `crate::`, `super::`, `self::` or a module in scope (macro
//! arguments that parse as expressions included), resolves to an item
//! defined in the other file. Resolving follows `use`s, re-exports and
//! globs to where the item is defined: `use crate::ddp::Bucket` names
//! `src/ddp/reducer/buckets.rs` when `src/ddp/mod.rs` only re-exports it,
//! and names `src/ddp/mod.rs` when it is defined there or cannot be
//! followed. (Were every path through a `mod.rs` to name it, each child that
//! uses a sibling through `super::` would be in a circle with its parent as
//! soon as the parent re-exports anything of it.) A path that names a
//! module and no item in it (`use super::buckets;`) uses nothing by itself:
//! the paths through it do.
//!
//! A circle is then:
//!
//! - two files each using an item of the other, wherever they are: two
//!   siblings (`a.rs` and `b.rs` of one module), cousins
//!   (`reducer/buckets.rs` and `wrapper/step.rs`), or a parent whose own
//!   file uses the child's items while the child uses an item *defined* in
//!   the parent's file. A parent that declares `mod child;` and re-exports
//!   the child's items is no circle by that alone, nor is a child that uses
//!   what the parent only re-exports from a third file: that names the
//!   third file;
//! - a ring of three or more sibling files, each using an item of the next.
//!
//! Two modules are not a circle when the piece they share lives below one
//! of them and imports neither: `mpi/job.rs` uses `mpi/shm/progress.rs`
//! while `mpi/shm.rs` uses `job.rs`, which is the third file of
//! docs/architecture.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use proc_macro2::{Span, TokenStream};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, Expr, Item, Meta, UseTree};

/// The folders whose crates are checked, from the repository root.
pub const TOPS: &[&str] = &["src", "examples", "xtask/src"];

/// The circles the check found when it came, each (parent, child): a
/// parent file that defines a type or function its child file uses, while
/// it uses the child's (most often the parent's config or trait, and the
/// child's functions that the parent calls or re-exports). Each is to be
/// untangled by moving what the child uses into a file of its own; until
/// then it is listed here, so that the check fails on any new circle. An
/// entry that is no longer a circle fails the check too: delete it.
pub const KNOWN: &[(&str, &str)] = &[
    ("examples/bench_collectives.rs", "examples/support/mpi_collectives.rs"),
    ("examples/bench_vs_pytorch.rs", "examples/support/vs_pytorch_all_reduce.rs"),
    ("examples/train.rs", "examples/support/train_backends.rs"),
    ("src/ch04_accumulation/mod.rs", "src/ch04_accumulation/exercise.rs"),
    ("src/dist/mod.rs", "src/dist/error.rs"),
    ("src/dist/mod.rs", "src/dist/local/group.rs"),
    ("src/dist/mod.rs", "src/dist/local/spawn.rs"),
    ("src/dist/mod.rs", "src/dist/settings.rs"),
    ("src/dist/mpi/engine.rs", "src/dist/mpi/engine/point_to_point.rs"),
    ("src/dist/mpi/ffi.rs", "src/dist/mpi/ffi/window.rs"),
    ("src/dist/mpi/shm.rs", "src/dist/mpi/shm/chain.rs"),
    ("src/dist/mpi/shm.rs", "src/dist/mpi/shm/regions.rs"),
    ("src/dist/nccl/group.rs", "src/dist/nccl/p2p.rs"),
    ("xtask/src/tool_checks.rs", "xtask/src/tool_checks/browser.rs"),
    ("xtask/src/tool_checks.rs", "xtask/src/tool_checks/training.rs"),
];

/// One circle: its files (the parent first, or a ring in order), and
/// the circle in words with its fix.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Circle {
    pub files: Vec<String>,
    pub text: String,
}

/// What the check found.
#[derive(Debug, Default)]
pub struct CirclesOutcome {
    /// The crates read (the library, each example, xtask's lib and bins).
    pub crates: usize,
    /// The files of those crates, each counted once.
    pub files: usize,
    /// What fails the check: each circle not in the known list, each entry
    /// of that list that is no longer a circle, each file syn cannot read.
    pub problems: Vec<String>,
    /// The circles of the known list that are still there.
    pub known: Vec<Circle>,
}

/// The circles of this repository's crates under [`TOPS`], [`KNOWN`] apart.
pub fn import_circles(root: &Path) -> CirclesOutcome {
    import_circles_under(root, TOPS, KNOWN)
}

/// The circles of the crates whose roots are under `tops` (folders from
/// `root`): a source folder (`lib.rs`, `main.rs`, `bin/`) or an
/// `examples` folder (each `.rs` file, each `*/main.rs`). A circle between
/// the two files of an entry of `known` (parent, child) is set apart.
pub fn import_circles_under(root: &Path, tops: &[&str], known: &[(&str, &str)]) -> CirclesOutcome {
    let roots: Vec<PathBuf> = tops.iter().flat_map(|top| crate_roots(&root.join(top))).collect();
    let mut trees: Vec<CrateTree> = roots.iter().map(|file| CrateTree::load(root, file)).collect();
    adopt_unreached(root, tops, &mut trees);
    let mut files = BTreeSet::new();
    let mut circles = BTreeSet::new();
    let mut unreadable = BTreeSet::new();
    for tree in &trees {
        files.extend(tree.files.iter().map(|file| file.relative.clone()));
        unreadable.extend(tree.problems.iter().cloned());
        circles.extend(tree.circles());
    }
    let is_known = |circle: &Circle| known.iter().any(|(a, b)| circle.files == [*a, *b]);
    let (known_found, new): (Vec<Circle>, Vec<Circle>) = circles.into_iter().partition(is_known);
    // Only an entry both of whose files were read can be gone: the made-up
    // trees of the tests hold a few of this repository's files.
    let read = |path: &str| files.contains(path);
    let stale = known
        .iter()
        .filter(|(a, b)| read(a) && read(b) && !known_found.iter().any(|c| c.files == [*a, *b]))
        .map(|(a, b)| {
            format!("{a} <-> {b}: no longer a circle; delete it from KNOWN in xtask/src/layering_check/circles.rs")
        });
    let mut problems: Vec<String> = unreadable.into_iter().collect();
    problems.extend(new.into_iter().map(|circle| circle.text));
    problems.extend(stale);
    CirclesOutcome { crates: trees.len(), files: files.len(), problems, known: known_found }
}

/// The crate roots in `top`, sorted.
fn crate_roots(top: &Path) -> Vec<PathBuf> {
    let rust_files = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
        let mut found = Vec::new();
        for path in entries.filter_map(|entry| Some(entry.ok()?.path())) {
            if path.is_dir() {
                found.push(path.join("main.rs"));
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
        found.retain(|path| path.is_file());
        found
    };
    let mut roots = if top.file_name().is_some_and(|name| name == "examples") {
        rust_files(top)
    } else {
        let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"].iter().map(|name| top.join(name)).collect();
        roots.retain(|path| path.is_file());
        roots.extend(rust_files(&top.join("bin")));
        roots
    };
    roots.sort();
    roots
}

/// A file of a crate.
struct SourceFile {
    /// From the repository root, with `/`.
    relative: String,
    syntax: Rc<syn::File>,
}

/// A module: a whole file, or an inline `mod name { .. }` inside one.
#[derive(Default)]
struct Module {
    parent: Option<usize>,
    file: usize,
    inline: bool,
    children: BTreeMap<String, usize>,
    /// The items defined here (types, functions, traits, constants, ..).
    items: BTreeSet<String>,
    /// Each name a `use` here brings in, and the path it names.
    bindings: Vec<(String, Vec<String>)>,
    /// The paths of `use path::*` here.
    globs: Vec<Vec<String>>,
}

/// Where a path leads: an item of `module`, or `module` itself (`item` None).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    module: usize,
    item: Option<String>,
}

/// One name found in a lookup.
enum Found {
    Module(usize),
    Item(usize, String),
    /// Something outside the crate (another crate, the prelude).
    Outside,
    Nothing,
}

/// A path written in a file, to resolve from the module it is written in.
struct Reference {
    module: usize,
    path: Vec<String>,
    line: usize,
}

/// One use of an item of another file: where, what, and from which file.
#[derive(Clone, Debug)]
struct Evidence {
    from_file: usize,
    line: usize,
    item: String,
    to_file: usize,
}

/// One crate's module tree, read with syn.
struct CrateTree {
    files: Vec<SourceFile>,
    modules: Vec<Module>,
    problems: Vec<String>,
    repo_root: PathBuf,
}

impl CrateTree {
    fn load(repo_root: &Path, crate_root: &Path) -> CrateTree {
        let mut tree = CrateTree {
            files: Vec::new(),
            modules: Vec::new(),
            problems: Vec::new(),
            repo_root: repo_root.into(),
        };
        let dir = crate_root.parent().unwrap_or(repo_root).to_path_buf();
        tree.load_file(crate_root, "crate", None, dir);
        tree
    }

    /// Reads `path` as the module `name` under `parent`, its own `mod x;`
    /// looked for in `child_dir`. None when it is missing (a `mod` behind a
    /// `cfg` may name no file) or is already on the way down (a loop).
    fn load_file(
        &mut self,
        path: &Path,
        name: &str,
        parent: Option<usize>,
        child_dir: PathBuf,
    ) -> Option<usize> {
        let path = normalize(path);
        let text = std::fs::read_to_string(&path).ok()?;
        let relative =
            path.strip_prefix(&self.repo_root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
        let mut ancestor = parent;
        while let Some(up) = ancestor {
            if self.files[self.modules[up].file].relative == relative {
                return None;
            }
            ancestor = self.modules[up].parent;
        }
        let syntax = match self.files.iter().find(|file| file.relative == relative) {
            Some(file) => file.syntax.clone(),
            None => match syn::parse_file(&text) {
                Ok(syntax) => Rc::new(syntax),
                Err(error) => {
                    let at = error.span().start();
                    self.problems.push(format!(
                        "{relative}: syn cannot read it (line {}, column {}: {error}): the circle check needs to",
                        at.line,
                        at.column + 1
                    ));
                    return None;
                }
            },
        };
        let file = match self.files.iter().position(|file| file.relative == relative) {
            Some(at) => at,
            None => {
                self.files.push(SourceFile { relative, syntax: syntax.clone() });
                self.files.len() - 1
            }
        };
        let module = self.add_module(name, parent, file, false);
        let path_dir = path.parent().unwrap_or(&self.repo_root).to_path_buf();
        self.add_items(module, &syntax.items, &child_dir, &path_dir);
        Some(module)
    }

    fn add_module(&mut self, name: &str, parent: Option<usize>, file: usize, inline: bool) -> usize {
        self.modules.push(Module { parent, file, inline, ..Module::default() });
        let id = self.modules.len() - 1;
        if let Some(parent) = parent {
            self.modules[parent].children.insert(name.to_string(), id);
        }
        id
    }

    /// Records what `items` declare in `module`: children (loading their
    /// files: `mod x;` from `child_dir`, `#[path]` from `path_dir`), items,
    /// the names its `use`s bring in.
    fn add_items(&mut self, module: usize, items: &[Item], child_dir: &Path, path_dir: &Path) {
        for item in items {
            let defined = match item {
                Item::Mod(declared) => {
                    let name = declared.ident.to_string();
                    let path_attr = path_attribute(&declared.attrs);
                    if let Some((_, inner)) = &declared.content {
                        let file = self.modules[module].file;
                        let child = self.add_module(&name, Some(module), file, true);
                        let dir = path_attr.map_or_else(|| child_dir.join(&name), |p| path_dir.join(p));
                        self.add_items(child, inner, &dir, &dir);
                    } else if let Some(path) = path_attr {
                        // A file reached by `#[path]` keeps its own `mod x;` beside it, as mod.rs does.
                        let file = normalize(&path_dir.join(path));
                        let dir = file.parent().unwrap_or(path_dir).to_path_buf();
                        self.load_file(&file, &name, Some(module), dir);
                    } else {
                        let flat = child_dir.join(format!("{name}.rs"));
                        let (file, dir) = if flat.is_file() {
                            (flat, child_dir.join(&name))
                        } else {
                            (child_dir.join(&name).join("mod.rs"), child_dir.join(&name))
                        };
                        self.load_file(&file, &name, Some(module), dir);
                    }
                    None
                }
                Item::Use(used) => {
                    for leaf in use_leaves(&used.tree, used.leading_colon.is_some()) {
                        match leaf.bound {
                            Some(name) => self.modules[module].bindings.push((name, leaf.path)),
                            None => {
                                let mut path = leaf.path;
                                path.pop(); // the `*`
                                self.modules[module].globs.push(path);
                            }
                        }
                    }
                    None
                }
                Item::Const(item) => Some(item.ident.to_string()),
                Item::Enum(item) => Some(item.ident.to_string()),
                Item::Fn(item) => Some(item.sig.ident.to_string()),
                Item::Macro(item) => item.ident.as_ref().map(ToString::to_string),
                Item::Static(item) => Some(item.ident.to_string()),
                Item::Struct(item) => Some(item.ident.to_string()),
                Item::Trait(item) => Some(item.ident.to_string()),
                Item::TraitAlias(item) => Some(item.ident.to_string()),
                Item::Type(item) => Some(item.ident.to_string()),
                Item::Union(item) => Some(item.ident.to_string()),
                Item::ForeignMod(foreign) => {
                    for inner in &foreign.items {
                        let name = match inner {
                            syn::ForeignItem::Fn(f) => f.sig.ident.to_string(),
                            syn::ForeignItem::Static(s) => s.ident.to_string(),
                            syn::ForeignItem::Type(t) => t.ident.to_string(),
                            _ => continue,
                        };
                        self.modules[module].items.insert(name);
                    }
                    None
                }
                _ => None,
            };
            if let Some(name) = defined {
                self.modules[module].items.insert(name);
            }
        }
    }

    /// The module that is a whole file and holds `module`.
    fn file_module(&self, mut module: usize) -> usize {
        while self.modules[module].inline {
            module = self.modules[module].parent.expect("an inline module sits in a file");
        }
        module
    }

    fn ancestors(&self, module: usize) -> Vec<usize> {
        let mut chain = vec![module];
        while let Some(parent) = self.modules[*chain.last().expect("not empty")].parent {
            chain.push(parent);
        }
        chain
    }

    /// `name` as seen from inside `module`: a child, an item, what a `use`
    /// brings in, what a glob brings in. `depth` stops re-export loops.
    fn lookup(&self, module: usize, name: &str, depth: usize) -> Found {
        if depth > 24 {
            return Found::Nothing;
        }
        let here = &self.modules[module];
        if let Some(&child) = here.children.get(name) {
            return Found::Module(child);
        }
        if here.items.contains(name) {
            return Found::Item(module, name.to_string());
        }
        if let Some((_, path)) = here.bindings.iter().find(|(bound, _)| bound == name) {
            return match self.resolve(module, path, depth + 1) {
                Some(Named { module, item: None }) => Found::Module(module),
                Some(Named { module, item: Some(item) }) => Found::Item(module, item),
                None => Found::Outside,
            };
        }
        for glob in &here.globs {
            if let Some(Named { module: source, item: None }) = self.resolve(module, glob, depth + 1) {
                if source != module {
                    match self.lookup(source, name, depth + 1) {
                        Found::Nothing | Found::Outside => {}
                        found => return found,
                    }
                }
            }
        }
        Found::Nothing
    }

    /// Where `path`, written in `module`, leads; None when it leaves the crate.
    fn resolve(&self, module: usize, path: &[String], depth: usize) -> Option<Named> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "::" => return None,
            "crate" => *self.ancestors(module).last().expect("a root"),
            "self" => module,
            "super" => self.modules[module].parent?,
            name => match self.lookup(module, name, depth) {
                Found::Module(found) => found,
                Found::Item(found, item) => return Some(Named { module: found, item: Some(item) }),
                Found::Outside | Found::Nothing => return None,
            },
        };
        for name in rest {
            match name.as_str() {
                "*" => return Some(Named { module: at, item: Some("*".into()) }),
                "self" => {}
                "super" => at = self.modules[at].parent?,
                name => match self.lookup(at, name, depth) {
                    Found::Module(found) => at = found,
                    // What follows an item (`Enum::Variant`, `Type::new`) is the item's.
                    Found::Item(found, item) => return Some(Named { module: found, item: Some(item) }),
                    Found::Outside => return None,
                    // Not found (made by a macro?): it is named where the path got to.
                    Found::Nothing => return Some(Named { module: at, item: Some(name.to_string()) }),
                },
            }
        }
        Some(Named { module: at, item: None })
    }

    /// Every use of an item of another file.
    fn evidence(&self) -> Vec<(usize, usize, Evidence)> {
        let mut found = Vec::new();
        let mut seen_files = BTreeSet::new();
        for (id, module) in self.modules.iter().enumerate() {
            if module.inline || !seen_files.insert(module.file) {
                continue;
            }
            let mut collector = Collector { tree: self, stack: vec![id], found: Vec::new() };
            collector.visit_file(&self.files[module.file].syntax);
            for reference in collector.found {
                let Some(Named { module: target, item: Some(item) }) =
                    self.resolve(reference.module, &reference.path, 0)
                else {
                    continue;
                };
                let (from, to) = (self.file_module(reference.module), self.file_module(target));
                if self.modules[from].file == self.modules[to].file {
                    continue;
                }
                let evidence = Evidence {
                    from_file: self.modules[from].file,
                    line: reference.line,
                    item,
                    to_file: self.modules[to].file,
                };
                found.push((from, to, evidence));
            }
        }
        found
    }

    /// The circles, each in words with its fix.
    fn circles(&self) -> Vec<Circle> {
        // (a, b): file a uses items defined in file b (a, b: their modules).
        let mut uses: BTreeMap<(usize, usize), Vec<Evidence>> = BTreeMap::new();
        for (from, to, evidence) in self.evidence() {
            uses.entry((from, to)).or_default().push(evidence);
        }
        let mut found = Vec::new();
        for ((a, b), a_uses_b) in &uses {
            let Some(b_uses_a) = uses.get(&(*b, *a)) else { continue };
            // Once a pair: the parent first, else the first by path.
            let (a_above, b_above) = (self.ancestors(*b).contains(a), self.ancestors(*a).contains(b));
            let first = if a_above || b_above { a_above } else { self.path_of(*a) < self.path_of(*b) };
            if first {
                found.push(self.describe_pair(*a, *b, a_uses_b, b_uses_a, a_above));
            }
        }
        found.extend(self.rings(&uses));
        found
    }

    /// Rings of three or more sibling files, each using the next, that no
    /// pair above already explains.
    fn rings(&self, uses: &BTreeMap<(usize, usize), Vec<Evidence>>) -> Vec<Circle> {
        let siblings = |a: usize, b: usize| self.modules[a].parent == self.modules[b].parent;
        let mut one_way: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &(a, b) in uses.keys() {
            if siblings(a, b) && !uses.contains_key(&(b, a)) {
                one_way.entry(a).or_default().push(b);
            }
        }
        let mut found = Vec::new();
        let mut reported: BTreeSet<BTreeSet<usize>> = BTreeSet::new();
        for &start in one_way.keys() {
            // The shortest way back to `start`, breadth first.
            let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut closed = None;
            while let (Some(at), None) = (queue.pop_front(), closed) {
                for &next in one_way.get(&at).into_iter().flatten() {
                    if next == start {
                        closed = Some(at);
                    } else if let std::collections::btree_map::Entry::Vacant(entry) = came_from.entry(next) {
                        entry.insert(at);
                        queue.push_back(next);
                    }
                }
            }
            let Some(last) = closed else { continue };
            let mut ring = vec![last];
            while ring[ring.len() - 1] != start {
                ring.push(came_from[&ring[ring.len() - 1]]);
            }
            ring.reverse();
            if !reported.insert(ring.iter().copied().collect()) {
                continue;
            }
            let files: Vec<String> = ring.iter().map(|m| self.path_of(*m)).collect();
            let dir = common_dir(&files);
            let steps: Vec<String> = ring
                .iter()
                .zip(ring.iter().cycle().skip(1))
                .map(|(a, b)| self.say_uses(&uses[&(*a, *b)], &dir))
                .collect();
            let text = format!(
                "{} -> {}: {}; move what closes the ring into a file that none of them imports",
                files.join(" -> "),
                files[0],
                steps.join("; ")
            );
            found.push(Circle { files, text });
        }
        found
    }

    fn path_of(&self, module: usize) -> String {
        self.files[self.modules[module].file].relative.clone()
    }

    /// `a <-> b: a.rs:3 uses `X` from b.rs; b.rs:7 uses `Y` from a.rs; the fix`.
    fn describe_pair(
        &self,
        a: usize,
        b: usize,
        a_uses_b: &[Evidence],
        b_uses_a: &[Evidence],
        parent: bool,
    ) -> Circle {
        let files = vec![self.path_of(a), self.path_of(b)];
        let dir = common_dir(&files);
        let fix = if parent {
            format!(
                "move what {} uses of {} into a file of its own that both import",
                short(&files[1], &dir),
                short(&files[0], &dir)
            )
        } else {
            "move the piece they share into a third file that imports neither".to_string()
        };
        let text = format!(
            "{} <-> {}: {}; {}; {fix}",
            files[0],
            files[1],
            self.say_uses(a_uses_b, &dir),
            self.say_uses(b_uses_a, &dir)
        );
        Circle { files, text }
    }

    /// `a.rs uses `X` (line 3), `Y` (line 9) from b.rs`: the first three
    /// items, then how many more.
    fn say_uses(&self, evidence: &[Evidence], dir: &str) -> String {
        let mut items: Vec<(usize, &str)> = evidence.iter().map(|e| (e.line, e.item.as_str())).collect();
        items.sort();
        items.dedup();
        let mut said: Vec<String> =
            items.iter().take(3).map(|(line, item)| format!("`{item}` (line {line})")).collect();
        if items.len() > 3 {
            said.push(format!("{} more", items.len() - 3));
        }
        format!(
            "{} uses {} from {}",
            short(&self.files[evidence[0].from_file].relative, dir),
            said.join(", "),
            short(&self.files[evidence[0].to_file].relative, dir)
        )
    }
}

/// The folder that holds all `paths`, with its `/`.
fn common_dir(paths: &[String]) -> String {
    let mut dir: Vec<&str> = paths[0].split('/').collect();
    dir.pop();
    for path in &paths[1..] {
        let parts: Vec<&str> = path.split('/').collect();
        let same = dir.iter().zip(&parts[..parts.len() - 1]).take_while(|(a, b)| a == b).count();
        dir.truncate(same);
    }
    dir.iter().map(|part| format!("{part}/")).collect()
}

/// `path` without the folder `dir` that holds it.
fn short<'a>(path: &'a str, dir: &str) -> &'a str {
    path.strip_prefix(dir).unwrap_or(path)
}

/// Gathers the paths of one file that may name another file's items.
struct Collector<'t> {
    tree: &'t CrateTree,
    /// The module being read: the file's, then each inline `mod` inside it.
    stack: Vec<usize>,
    found: Vec<Reference>,
}

impl Collector<'_> {
    fn module(&self) -> usize {
        *self.stack.last().expect("inside the file's module")
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, declared: &'ast syn::ItemMod) {
        if declared.content.is_none() {
            return; // a file of its own: read on its own
        }
        let Some(&child) = self.tree.modules[self.module()].children.get(&declared.ident.to_string()) else {
            return;
        };
        self.stack.push(child);
        visit::visit_item_mod(self, declared);
        self.stack.pop();
    }

    fn visit_item_use(&mut self, used: &'ast syn::ItemUse) {
        let module = self.module();
        for leaf in use_leaves(&used.tree, used.leading_colon.is_some()) {
            self.found.push(Reference { module, path: leaf.path, line: leaf.line });
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let module = self.module();
        let rooted = path.leading_colon.is_none()
            && segments.len() >= 2
            && (matches!(segments[0].as_str(), "crate" | "super" | "self")
                || matches!(self.tree.lookup(module, &segments[0], 0), Found::Module(_)));
        if rooted {
            let line = path.segments.first().map_or(0, |s| s.ident.span().start().line);
            self.found.push(Reference { module, path: segments, line });
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, called: &'ast syn::Macro) {
        visit::visit_macro(self, called);
        // `vec![..]`, `assert_eq!(..)`, `format!(..)`: arguments that are
        // expressions (or statements) are code like any other.
        let tokens: TokenStream = called.tokens.clone();
        let as_exprs =
            |input: syn::parse::ParseStream| Punctuated::<Expr, syn::Token![,]>::parse_terminated(input);
        if let Ok(exprs) = syn::parse::Parser::parse2(as_exprs, tokens.clone()) {
            exprs.iter().for_each(|expr| self.visit_expr(expr));
        } else if let Ok(stmts) = syn::parse::Parser::parse2(syn::Block::parse_within, tokens) {
            stmts.iter().for_each(|stmt| self.visit_stmt(stmt));
        }
    }
}

/// One leaf of a `use` tree: the path it names (`*` last for a glob), the
/// name it brings in (None for a glob), and its line.
struct UseLeaf {
    path: Vec<String>,
    bound: Option<String>,
    line: usize,
}

/// The leaves of a `use` tree: `a::{self, b::C as D, e::*}` gives `a` (as
/// `a`), `a::b::C` (as `D`) and `a::e::*`.
fn use_leaves(tree: &UseTree, leading_colon: bool) -> Vec<UseLeaf> {
    fn walk(tree: &UseTree, prefix: &mut Vec<String>, found: &mut Vec<UseLeaf>) {
        let leaf = |name: &syn::Ident, bound: Option<String>, span: Span, found: &mut Vec<UseLeaf>| {
            let mut path = prefix.clone();
            if name != "self" {
                path.push(name.to_string());
            }
            let bound = bound.or_else(|| path.last().cloned());
            found.push(UseLeaf { path, bound, line: span.start().line });
        };
        match tree {
            UseTree::Path(step) => {
                prefix.push(step.ident.to_string());
                walk(&step.tree, prefix, found);
                prefix.pop();
            }
            UseTree::Name(name) => leaf(&name.ident, None, name.ident.span(), found),
            UseTree::Rename(rename) => {
                leaf(&rename.ident, Some(rename.rename.to_string()), rename.ident.span(), found)
            }
            UseTree::Glob(glob) => {
                let mut path = prefix.clone();
                path.push("*".into());
                found.push(UseLeaf { path, bound: None, line: glob.star_token.span.start().line });
            }
            UseTree::Group(group) => group.items.iter().for_each(|item| walk(item, prefix, found)),
        }
    }
    let mut prefix = if leading_colon { vec!["::".to_string()] } else { vec![] };
    let mut found = Vec::new();
    walk(tree, &mut prefix, &mut found);
    found
}

/// The value of a `#[path = "..."]` among `attrs`.
fn path_attribute(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        let Meta::NameValue(pair) = &attr.meta else { return None };
        let Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(text), .. }) = &pair.value else { return None };
        pair.path.is_ident("path").then(|| text.value())
    })
}

/// `path` with its `.` and `..` taken out, without reading the disk.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Files under `tops` that no `mod` reaches (a macro declares them, as
/// `figure_modules!` in examples/figures.rs does) join the crate of the
/// file their folder belongs to: `examples/figures/ch01_ring.rs` is module
/// `ch01_ring` of the crate whose root, or module, is `examples/figures.rs`.
fn adopt_unreached(root: &Path, tops: &[&str], trees: &mut [CrateTree]) {
    let reached: BTreeSet<String> =
        trees.iter().flat_map(|tree| tree.files.iter().map(|file| file.relative.clone())).collect();
    for top in tops {
        for file in crate::layout::rust_files_under(&root.join(top)) {
            let relative = file.strip_prefix(root).unwrap_or(&file).to_string_lossy().replace('\\', "/");
            if reached.contains(&relative) || file.file_name().is_some_and(|name| name == "mod.rs") {
                continue;
            }
            let Some(folder) = relative.rsplit_once('/').map(|(folder, _)| folder.to_string()) else {
                continue;
            };
            let owner = format!("{folder}.rs");
            let name = file.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
            for tree in trees.iter_mut() {
                let parent =
                    tree.modules.iter().position(|m| !m.inline && tree.files[m.file].relative == owner);
                if let Some(parent) = parent.filter(|p| !tree.modules[*p].children.contains_key(&name)) {
                    let dir = file.parent().unwrap_or(root).join(&name);
                    tree.load_file(&file, &name, Some(parent), dir);
                }
            }
        }
    }
}
