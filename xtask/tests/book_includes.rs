//! Unit tests of the `includes` check, on a
//! small book written into a temporary folder. Run: cargo test -p xtask --test book_includes

use std::fs;
use std::path::PathBuf;

use xtask::book_includes::{book_source_dir, check_book, find_links, selected_lines};

/// A fresh, empty folder under the system's temporary folder.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("a temporary folder");
    dir
}

const CODE: &str = "\
fn before() {}
// ANCHOR: ring
fn ring() {}
// ANCHOR: inner
fn inner() {}
// ANCHOR_END: inner
// ANCHOR_END: ring
// ANCHOR: empty
// ANCHOR_END: empty
// ANCHOR: unclosed
fn after() {}
";

#[test]
fn a_book_with_good_and_broken_includes() {
    let root = temp_dir("book");
    fs::write(
        root.join("book.toml"),
        "[book]\ntitle = \"t\"\nsrc = \"pages\"\n\n[build]\nsrc = \"not this\"\n",
    )
    .unwrap();
    fs::create_dir_all(root.join("pages/part")).unwrap();
    fs::create_dir_all(root.join("code")).unwrap();
    fs::write(root.join("code/lib.rs"), CODE).unwrap();
    let page = "\
# Good
{{#include ../code/lib.rs:ring}}
{{#rustdoc_include ../code/lib.rs:2:3}}
{{#playground ../code/lib.rs editable}}
\\{{#include ../code/missing.rs}} is how you write one
{{#title Not a file}}
# Broken
{{#include ../code/missing.rs}}
{{#include ../code/lib.rs:nowhere}}
{{#include ../code/lib.rs:unclosed}}
{{#include ../code/lib.rs:empty}}
{{#include ../code/lib.rs:40:50}}
";
    fs::write(root.join("pages/chapter.md"), page).unwrap();
    fs::write(root.join("pages/part/deeper.md"), "{{ #include ../../code/lib.rs:inner }}\n").unwrap();

    let outcome = check_book(&root).expect("a book");
    assert_eq!((outcome.pages, outcome.includes), (2, 9));
    let broken = outcome.broken.join("\n");
    assert_eq!(outcome.broken.len(), 5, "{broken}");
    assert!(
        broken.contains("pages/chapter.md:8: {{#include ../code/missing.rs}}\n      file not found"),
        "{broken}"
    );
    assert!(broken.contains("no line `// ANCHOR: nowhere`"), "{broken}");
    assert!(broken.contains("`// ANCHOR: unclosed` has no `// ANCHOR_END: unclosed` after it"), "{broken}");
    assert!(broken.contains("chapter.md:11:") && broken.contains("chapter.md:12:"), "{broken}");
    assert!(broken.contains("selects no code"), "{broken}");
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn no_book_toml_is_an_error() {
    let root = temp_dir("no-book");
    assert!(check_book(&root).unwrap_err().contains("no book.toml"));
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn selectors_pick_lines_as_mdbook_does() {
    assert_eq!(selected_lines(CODE, "ring").unwrap(), ["fn ring() {}", "fn inner() {}"]);
    assert_eq!(selected_lines(CODE, "2").unwrap(), ["// ANCHOR: ring"]);
    assert_eq!(selected_lines(CODE, "3:3").unwrap(), ["fn ring() {}"]);
    assert_eq!(selected_lines(CODE, "10:").unwrap(), ["// ANCHOR: unclosed", "fn after() {}"]);
    assert_eq!(selected_lines(CODE, ":1").unwrap(), ["fn before() {}"]);
    assert_eq!(selected_lines(CODE, "").unwrap().len(), 11);
    assert!(selected_lines(CODE, "5:2").unwrap().is_empty());
}

#[test]
fn links_and_the_book_source_folder_are_read() {
    let links = find_links("a\n{{#include x.rs:one}} b {{#include  y.rs }}\n\\{{#include z.rs}}");
    let found: Vec<(usize, &str, &str)> =
        links.iter().map(|l| (l.line, l.kind.as_str(), l.target.as_str())).collect();
    assert_eq!(found, [(2, "include", "x.rs:one"), (2, "include", "y.rs ")]);
    assert_eq!(book_source_dir("[book]\nsrc = \"chapters\" # the pages\n"), "chapters");
    assert_eq!(book_source_dir("[book]\ntitle = \"x\"\n"), "src");
}
