//! Unit tests of the path scanner behind the
//! `files` check. The sample texts use prefixes of their own (`kit/`,
//! `.hidden/`), so that the check, scanning this file, finds nothing here.
//! Run: cargo test -p xtask --test files_check

use xtask::files_check::{
    find_outside_references, is_scanned_for_paths, mentioned_paths, outside_references, Mention,
};

const PREFIXES: &[&str] = &["kit/", ".hidden/"];

fn paths(text: &str) -> Vec<String> {
    mentioned_paths(text, PREFIXES).into_iter().map(|mention| mention.path).collect()
}

#[test]
fn paths_are_found_with_their_lines() {
    let text =
        "Run `kit/run.sh`, then see kit/guide.md.\nThe folder kit/data/ and [the notes](kit/notes.md#top).";
    assert_eq!(
        mentioned_paths(text, PREFIXES),
        [
            Mention { line: 1, path: "kit/run.sh".into() },
            Mention { line: 1, path: "kit/guide.md".into() },
            Mention { line: 2, path: "kit/data/".into() },
            Mention { line: 2, path: "kit/notes.md".into() },
        ]
    );
}

#[test]
fn only_words_that_start_with_a_prefix_count() {
    assert_eq!(paths("other/kit/x.rs and ../kit/y.rs and https://host/kit/z.rs"), Vec::<String>::new());
    assert_eq!(paths("./kit/start.sh and .hidden/config.toml"), ["kit/start.sh", ".hidden/config.toml"]);
    assert_eq!(
        paths("\"kit/in_a_string.rs\", (kit/in_parens.py)"),
        ["kit/in_a_string.rs", "kit/in_parens.py"]
    );
}

#[test]
fn placeholders_and_words_without_an_extension_are_not_paths() {
    let text = "kit/chapter_NN.rs kit/ch*/x.rs kit/<chapter>/x.rs kit/ch{nn}_x/ kit/.../mod.rs kit/module kit/a.unknown";
    assert_eq!(paths(text), Vec::<String>::new());
    assert_eq!(paths("<code>kit/real.rs</code>"), ["kit/real.rs"]);
}

/// `folder/name`, written in two parts so that the `files` check, which
/// scans this file too, does not take these made-up names for mentions.
fn in_folder(folder: &str, name: &str) -> String {
    format!("{folder}/{name}")
}

#[test]
fn the_scanned_files_are_the_docs_scripts_and_code() {
    let scanned = [
        "README.md".to_string(),
        ".ci/run".to_string(),
        in_folder("docs", "a.md"),
        in_folder("chapters", "01.md"),
        in_folder("notebooks", "01.ipynb"),
        in_folder("scripts", "setup.sh"),
        in_folder("src", "dist/mod.rs"),
        in_folder("tests", "chapter_04/training.rs"),
        in_folder("examples", "train.rs"),
        in_folder("xtask", "Cargo.toml"),
    ];
    for path in scanned {
        assert!(is_scanned_for_paths(&path), "{path}");
    }
    let skipped =
        ["Cargo.lock".to_string(), in_folder("scripts", "testdata/x.ipynb"), in_folder("src", "data.txt")];
    for path in skipped {
        assert!(!is_scanned_for_paths(&path), "{path}");
    }
}

#[test]
fn references_outside_the_repository_are_found() {
    let references = outside_references();
    assert_eq!(references.len(), 3);
    let text = format!("fine\nsee {} for why\nand {}/notes", references[0], references[2]);
    assert_eq!(
        find_outside_references(&text, &references),
        [(2, references[0].clone()), (3, references[2].clone())]
    );
}
