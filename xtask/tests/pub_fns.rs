//! Unit tests of the `pub fn` reader behind the
//! `stubs` check and `cargo workbook`. Run: cargo test -p xtask --test pub_fns

use xtask::pub_fns::{read, PubFn};

const EXERCISE: &str = r##"//! A chapter's exercise: ünïcode before the items shifts no position.
use tch::Tensor;

// ANCHOR: stub
/// Sums the chunks.
/// Second line, with a brace: {
#[allow(unused_variables)] // delete this line once you use the arguments
pub fn ring_sum<'a, T: Into<f64>>(chunks: &'a mut [Tensor], scale: T) -> Result<(), String>
where
    T: Copy,
{
    // TODO: a comment with braces } { and the words pub fn fake()
    let text = "pub fn not_this() { ";
    let raw = r#"}"#;
    let quote = '"';
    todo!("exercise ch01: ring_sum in src/ch01_collectives/exercise.rs {}", '}')
}
// ANCHOR_END: stub

/// Over two lines
/// because rustfmt said so.
#[allow(
    clippy::too_many_arguments
)]
pub fn long(
    a: i64,
    b: i64,
) -> i64 {
    a + b
}

pub(crate) fn hidden() {}
fn private() {}

impl Ring {
    /// A method counts too.
    pub fn size(&self) -> usize {
        todo!("exercise ch01: size")
    }
}
"##;

fn named<'a>(fns: &'a [PubFn], name: &str) -> &'a PubFn {
    fns.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("no `{name}`"))
}

#[test]
fn every_pub_fn_is_found_with_its_line_doc_comment_and_signature() {
    let found = read(EXERCISE).expect("it parses").fns;
    let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["ring_sum", "long", "size"], "comments, strings and private fns are not pub fns");

    let ring_sum = named(&found, "ring_sum");
    assert_eq!(ring_sum.line, 8);
    assert_eq!(
        ring_sum.doc,
        [(5, " Sums the chunks.".to_string()), (6, " Second line, with a brace: {".to_string())]
    );
    assert_eq!(
        ring_sum.signature,
        "pub fn ring_sum<'a, T: Into<f64>>(chunks: &'a mut [Tensor], scale: T) -> Result<(), String> where T: Copy,"
    );
    let long = named(&found, "long");
    assert_eq!(
        long.doc.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>(),
        [" Over two lines", " because rustfmt said so."],
        "the attribute between the doc comment and the fn does not end it"
    );
    assert_eq!(named(&found, "size").line, 37);
}

#[test]
fn a_body_is_one_todo_only_with_nothing_beside_it() {
    let found = read(EXERCISE).expect("it parses").fns;
    let ring_sum = named(&found, "ring_sum");
    assert!(!ring_sum.body_is_one_todo(), "let statements and format arguments beside it");
    assert_eq!(
        ring_sum.todo_messages(),
        ["exercise ch01: ring_sum in src/ch01_collectives/exercise.rs {}"],
        "the message is the literal's text"
    );
    assert!(named(&found, "size").body_is_one_todo());
    assert!(!named(&found, "long").body_is_one_todo());
    assert!(named(&found, "long").todo_messages().is_empty());
    for body in ["todo!(\"m\");", "// a comment\n    todo!(\"m\")", "todo!(\n        \"m\",\n    )"] {
        let source = format!("pub fn f() {{\n    {body}\n}}\n");
        assert!(read(&source).expect("it parses").fns[0].body_is_one_todo(), "{body}");
    }
    let not_one_todo = [
        "unimplemented!(\"m\")",
        "std::todo!(\"m\")",
        "todo![\"m\"]",
        "todo!()",
        "todo!(\"m\"); 1",
        "todo!(\"m {}\", x + 1)",
    ];
    for body in not_one_todo {
        let source = format!("pub fn f() {{\n    {body}\n}}\n");
        assert!(!read(&source).expect("it parses").fns[0].body_is_one_todo(), "{body}");
    }
}

#[test]
fn signatures_compare_without_their_layout() {
    let canonical = |source: &str| read(source).expect("it parses").fns.remove(0).canonical;
    let one_line = canonical("pub fn long(a: i64, b: i64) -> i64 {}");
    let wrapped = canonical("pub fn long(\n    a: i64,\n    b: i64,\n) -> i64 {}");
    assert_eq!(one_line, wrapped);
    assert_eq!(
        canonical("pub fn f<T: A<B,>>(x: &'a T) where T: C, {}"),
        canonical("pub fn f<T: A<B>>(x: &'a T) where T: C {}")
    );
    assert_ne!(one_line, canonical("pub fn long(a: i64, c: i64) -> i64 {}"));
    assert_ne!(one_line, canonical("pub fn long(a: i64, b: i64) -> i32 {}"));
}

#[test]
fn re_exported_names_are_found_with_their_line() {
    let source = "// pub use not::this;\npub use crate::ddp::{plan, sync as bucket_sync, nested::{a, b}};\npub use crate::ddp::mark_ready;\npub use glob::*;\nuse private::hidden;\npub use x::{self, Trait as _};\n";
    let found = read(source).expect("it parses").uses;
    let names: Vec<(usize, &str)> = found.iter().map(|(line, name)| (*line, name.as_str())).collect();
    assert_eq!(names, [(2, "plan"), (2, "bucket_sync"), (2, "a"), (2, "b"), (3, "mark_ready")]);
}

#[test]
fn a_file_that_is_not_rust_says_where() {
    let error = read("/// Doc.\npub fn f(x: i64 -> i64 {\n}\n").err().expect("not Rust");
    assert!(error.starts_with("line 2, column "), "{error}");
}
