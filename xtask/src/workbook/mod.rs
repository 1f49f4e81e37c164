//! What `cargo workbook` knows about the
//! chapters: where each one's files are, which exercises it has, and how far
//! the learner has got. The command itself is `xtask/src/bin/workbook.rs`.
//! Unit tests: xtask/tests/workbook.rs (`cargo test -p xtask`).

pub mod hints;
pub mod ranking;
pub mod verdict;

use std::path::{Path, PathBuf};

use crate::pub_fns;

/// One chapter with an exercise: `src/chNN_topic/exercise.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chapter {
    /// "03"
    pub number: String,
    /// The first heading of `chapters/NN-*.md`, or the folder's topic.
    pub title: String,
    /// `src/chNN_topic/`
    pub folder: PathBuf,
    /// The exercise's `pub fn`s, in file order.
    pub exercises: Vec<String>,
    /// Those still holding their `todo!("exercise chNN: ...")`.
    pub unwritten: Vec<String>,
}

impl Chapter {
    /// `tests/chapter_NN.rs`'s test target.
    pub fn test_target(&self) -> String {
        format!("chapter_{}", self.number)
    }

    pub fn exercise_file(&self) -> PathBuf {
        self.folder.join("exercise.rs")
    }

    pub fn hints_file(&self) -> PathBuf {
        self.folder.join("hints.md")
    }

    /// No exercise written yet: every stub still holds its `todo!`.
    pub fn untouched(&self) -> bool {
        self.unwritten.len() == self.exercises.len()
    }
}

/// Every chapter under `root/src` with an `exercise.rs`, in chapter order.
pub fn chapters(root: &Path) -> std::io::Result<Vec<Chapter>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root.join("src"))? {
        let folder = entry?.path();
        let Some(name) = folder.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
        let exercise = folder.join("exercise.rs");
        let Some(number) = name.strip_prefix("ch").and_then(|rest| rest.get(..2)) else { continue };
        if !number.chars().all(|c| c.is_ascii_digit()) || !exercise.is_file() {
            continue;
        }
        let number = number.to_string();
        let (exercises, unwritten) = exercises_of(&folder, &number)?;
        let topic = name.get(5..).unwrap_or("").replace('_', " ");
        let title = page_title(root, &number).unwrap_or(topic);
        found.push(Chapter { number, title, folder, exercises, unwritten });
    }
    found.sort_by(|a, b| a.number.cmp(&b.number));
    Ok(found)
}

/// The exercise's `pub fn`s, and those still holding their
/// `todo!("exercise chNN: ...")`. Mid-edit, the learner's file may not
/// parse: then the functions are the solution's (the `stubs` check keeps
/// both the same) and none counts as unwritten, so that `cargo workbook`
/// runs the tests and the compiler says what is wrong.
fn exercises_of(folder: &Path, number: &str) -> std::io::Result<(Vec<String>, Vec<String>)> {
    let marker = format!("exercise ch{number}:");
    if let Ok(file) = pub_fns::read(&std::fs::read_to_string(folder.join("exercise.rs"))?) {
        let names = file.fns.iter().map(|f| f.name.clone()).collect();
        let unwritten = file.fns.iter().filter(|f| f.todo_messages().iter().any(|m| m.starts_with(&marker)));
        return Ok((names, unwritten.map(|f| f.name.clone()).collect()));
    }
    let solution = std::fs::read_to_string(folder.join("solution.rs"))?;
    let file = pub_fns::read(&solution).unwrap_or_default();
    let defined = file.fns.into_iter().map(|f| f.name);
    let reexported =
        file.uses.into_iter().map(|(_, name)| name).filter(|n| !n.starts_with(char::is_uppercase));
    Ok((defined.chain(reexported).collect(), Vec::new()))
}

/// The `# Title` of the book page `chapters/NN-*.md`.
fn page_title(root: &Path, number: &str) -> Option<String> {
    let text = std::fs::read_to_string(chapter_page(root, number)?).ok()?;
    text.lines().find_map(|line| line.strip_prefix("# ")).map(|t| t.trim().to_string())
}

/// The book page of chapter `number`, `chapters/NN-*.md`, without its
/// reference solution's page.
pub fn chapter_page(root: &Path, number: &str) -> Option<PathBuf> {
    book_page(root, number, false)
}

/// The page of chapter `number`'s reference solution,
/// `chapters/NN-*-solution.md`: a page of its own, so that the chapter
/// never shows the answer; `cargo workbook` offers it once the chapter passes.
pub fn solution_page(root: &Path, number: &str) -> Option<PathBuf> {
    book_page(root, number, true)
}

fn book_page(root: &Path, number: &str, solution: bool) -> Option<PathBuf> {
    let pages = std::fs::read_dir(root.join("chapters")).ok()?;
    pages.filter_map(Result::ok).map(|e| e.path()).find(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            n.starts_with(&format!("{number}-"))
                && n.ends_with(".md")
                && n.ends_with("-solution.md") == solution
        })
    })
}

/// The chapter the learner named: "3", "03", "ch03" or "chapter_03".
pub fn find<'a>(chapters: &'a [Chapter], asked: &str) -> Option<&'a Chapter> {
    let digits: String = asked.chars().filter(char::is_ascii_digit).collect();
    let number: u32 = digits.parse().ok()?;
    chapters.iter().find(|c| c.number.parse::<u32>().ok() == Some(number))
}
