//! Unit tests of the `pub fn` finder behind the
//! `stubs` check. Run: cargo test -p xtask --test rust_source

use xtask::rust_source::{blank_comments_and_literals, canonical_signature, public_fns, public_uses};

const EXERCISE: &str = r##"//! A chapter's exercise.
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
pub fn declared_only();
"##;

#[test]
fn every_pub_fn_is_found_with_its_doc_comment_and_body() {
    let found = public_fns(EXERCISE);
    let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["ring_sum", "long", "declared_only"]);

    let ring_sum = &found[0];
    assert_eq!(ring_sum.line, 8);
    assert_eq!(
        ring_sum.doc,
        [(5, " Sums the chunks.".to_string()), (6, " Second line, with a brace: {".to_string())]
    );
    assert_eq!(
        ring_sum.signature,
        "pub fn ring_sum<'a, T: Into<f64>>(chunks: &'a mut [Tensor], scale: T) -> Result<(), String> where T: Copy,"
    );
    let body = ring_sum.body.as_deref().expect("a body");
    assert!(body.contains("todo!(\"exercise ch01: ring_sum"), "{body}");
    assert!(body.trim_end().ends_with("'}')"), "the body runs to its own closing brace: {body}");

    let long = &found[1];
    assert_eq!(
        long.doc.iter().map(|(_, text)| text.as_str()).collect::<Vec<_>>(),
        [" Over two lines", " because rustfmt said so."]
    );
    assert_eq!(long.body.as_deref().map(str::trim), Some("a + b"));
    assert_eq!(found[2].body, None);
}

#[test]
fn comments_and_literals_are_blanked_in_place() {
    let source = "let a = \"{\"; // }\nlet b = '{'; /* { /* nested } */ } */ let c: &'static str = r#\"}\"#;";
    let blanked = blank_comments_and_literals(source);
    assert_eq!(blanked.len(), source.len());
    assert!(!blanked.contains('{') && !blanked.contains('}'), "{blanked}");
    assert!(blanked.contains("&'static str"), "a lifetime is code: {blanked}");
    assert_eq!(blanked.lines().count(), 2);
}

#[test]
fn signatures_compare_without_their_layout() {
    let one_line = "pub fn long(a: i64, b: i64) -> i64";
    let wrapped = "pub fn long(\n    a: i64,\n    b: i64,\n) -> i64";
    assert_eq!(canonical_signature(one_line), canonical_signature(wrapped));
    assert_eq!(canonical_signature("pub fn f<T: A<B,>>(x: &'a T)"), "pub fn f<T:A<B>>(x:&'a T)");
    assert_ne!(canonical_signature(one_line), canonical_signature("pub fn long(a: i64, c: i64) -> i64"));
}

#[test]
fn re_exported_names_are_found_with_their_line() {
    let source = "// pub use not::this;\npub use crate::ddp::{plan, sync as bucket_sync, nested::{a, b}};\npub use crate::ddp::mark_ready;\npub use glob::*;\n";
    let found = public_uses(source);
    let names: Vec<(usize, &str)> = found.iter().map(|(line, name)| (*line, name.as_str())).collect();
    assert_eq!(names, [(2, "plan"), (2, "bucket_sync"), (2, "a"), (2, "b"), (3, "mark_ready")]);
}
