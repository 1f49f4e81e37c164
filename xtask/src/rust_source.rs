//! Just enough Rust lexing for the `stubs` check:
//! find each `pub fn` of a file with its doc comment, its signature and its
//! body. Unit tests: xtask/tests/rust_source.rs (`cargo test -p xtask`).
//!
//! Why a lexer at all: a brace or the words `pub fn` inside a comment or a
//! string (a `todo!("...")` message) must not count as code. Comments and the
//! insides of literals are blanked out first; positions stay the same, so a
//! match in the blanked text points into the original.

/// One `pub fn` of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubFn {
    pub name: String,
    /// 1-based line of `pub fn`.
    pub line: usize,
    /// The `///` lines directly above it (attributes and the book's
    /// `// ANCHOR` markers skipped), as (1-based line, text after `///`).
    pub doc: Vec<(usize, String)>,
    /// From `pub fn` up to its body's `{` (or the `;` of a declaration),
    /// comments removed and whitespace collapsed to single spaces.
    pub signature: String,
    /// The original text between the body's braces; `None` without a body.
    pub body: Option<String>,
}

/// `source` with every comment and the inside of every string and character
/// literal replaced by spaces. Newlines and byte positions are kept.
pub fn blank_comments_and_literals(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = bytes.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut out[from..to.min(bytes.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let is_ident = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let end = block_comment_end(bytes, i);
            blank(&mut out, i, end);
            i = end;
        } else if let Some(hashes) = raw_string_hashes(bytes, i, is_ident) {
            // r"..." or r#"..."#: no escapes; ends at `"` and as many `#`.
            let open = i + 1 + hashes + 1; // after r, the #s and the quote
            let mut closing = vec![b'"'];
            closing.extend(std::iter::repeat_n(b'#', hashes));
            let end = find(bytes, open, &closing).map_or(bytes.len(), |at| at + closing.len());
            blank(&mut out, open, end.saturating_sub(closing.len()));
            i = end;
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i + 1, j);
            i = j + 1;
        } else if rest[0] == b'\'' {
            i = match char_literal_end(bytes, i) {
                Some(end) => {
                    blank(&mut out, i + 1, end - 1);
                    end
                }
                None => i + 1, // a lifetime or a loop label: code
            };
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|bad| String::from_utf8_lossy(bad.as_bytes()).into_owned())
}

/// Where the (nested) block comment that starts at `start` ends.
fn block_comment_end(bytes: &[u8], start: usize) -> usize {
    let (mut depth, mut j) = (0, start);
    while j < bytes.len() {
        if bytes[j..].starts_with(b"/*") {
            depth += 1;
            j += 2;
        } else if bytes[j..].starts_with(b"*/") {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    bytes.len()
}

/// The number of `#`s if a raw string (r"", r#""#, br"") starts at `i`.
fn raw_string_hashes(bytes: &[u8], i: usize, is_ident: impl Fn(u8) -> bool) -> Option<usize> {
    let prefix_start = if i > 0 && bytes[i - 1] == b'b' { i - 1 } else { i };
    if bytes[i] != b'r' || (prefix_start > 0 && is_ident(bytes[prefix_start - 1])) {
        return None;
    }
    let hashes = bytes[i + 1..].iter().take_while(|&&b| b == b'#').count();
    (bytes.get(i + 1 + hashes) == Some(&b'"')).then_some(hashes)
}

/// The end (after the closing quote) of a character literal starting at
/// `start`, or `None` when the quote starts a lifetime instead.
fn char_literal_end(bytes: &[u8], start: usize) -> Option<usize> {
    let next = *bytes.get(start + 1)?;
    if next == b'\\' {
        // '\n', '\'', '\u{1F600}': the literal ends at the next quote after the escape.
        return find(bytes, start + 3, b"'").map(|at| at + 1);
    }
    let char_len = match next {
        0x00..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    };
    (bytes.get(start + 1 + char_len) == Some(&b'\'')).then_some(start + 2 + char_len)
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..bytes.len()).find(|&at| bytes[at..].starts_with(needle))
}

/// Every `pub fn` of a Rust file, in order.
pub fn public_fns(source: &str) -> Vec<PubFn> {
    let code = blank_comments_and_literals(source);
    let lines: Vec<&str> = source.lines().collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (start, _) in code.match_indices("pub") {
        if code[..start].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let after_pub = &code[start + 3..];
        let Some(after_fn) = after_pub.trim_start().strip_prefix("fn") else { continue };
        if after_pub.len() == after_pub.trim_start().len() || !after_fn.starts_with(char::is_whitespace) {
            continue; // `pubfn`, `pub fnord`
        }
        let name: String = after_fn.trim_start().chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() {
            continue;
        }
        let end = code[start..].find(['{', ';']).map_or(code.len(), |n| start + n);
        let signature = code[start..end].split_whitespace().collect::<Vec<_>>().join(" ");
        let body = (code.as_bytes().get(end) == Some(&b'{'))
            .then(|| matching_brace(&code, end))
            .flatten()
            .map(|close| source[end + 1..close].to_string());
        let line = code[..start].matches('\n').count() + 1;
        found.push(PubFn { name, line, doc: doc_comment_above(&lines, line - 1), signature, body });
    }
    found
}

/// The position of the `}` that closes the `{` at `open` (in blanked code).
fn matching_brace(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (at, byte) in code.bytes().enumerate().skip(open) {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

/// The `///` lines directly above line index `item` (0-based), skipping
/// attribute lines (also attributes over several lines) and `// ANCHOR`
/// markers, which the book needs and readers never see.
pub fn doc_comment_above(lines: &[&str], item: usize) -> Vec<(usize, String)> {
    let mut doc = Vec::new();
    let mut index = item;
    while index > 0 {
        index -= 1;
        let line = lines[index].trim();
        if let Some(text) = line.strip_prefix("///").filter(|_| !line.starts_with("////")) {
            doc.push((index + 1, text.trim_end().to_string()));
        } else if line.starts_with("#[") || line.starts_with("// ANCHOR") {
            continue;
        } else if line.ends_with(']') {
            // The last line of an attribute over several lines: go to its `#[`.
            let above = (index.saturating_sub(20)..index).rev().take_while(|&i| !lines[i].trim().is_empty());
            match above.into_iter().find(|&i| lines[i].trim().starts_with("#[")) {
                Some(opening) => index = opening,
                None => break,
            }
        } else {
            break;
        }
    }
    doc.reverse();
    doc
}

/// A signature reduced so that layout does not count: no whitespace except
/// one space between two words, no trailing comma before `)`, `>` or `]`.
/// `pub fn f(\n    a: A,\n) -> B` and `pub fn f(a: A) -> B` come out equal.
pub fn canonical_signature(signature: &str) -> String {
    let is_word = |c: char| c.is_alphanumeric() || c == '_' || c == '\'';
    let mut out = String::new();
    let mut pending_space = false;
    for c in signature.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space && out.chars().next_back().is_some_and(is_word) && is_word(c) {
            out.push(' ');
        }
        pending_space = false;
        if matches!(c, ')' | '>' | ']') && out.ends_with(',') {
            out.pop();
        }
        out.push(c);
    }
    out
}

/// The names a file re-exports with `pub use`, each with the 1-based line
/// of its `pub use`: `pub use a::{b, c::d as e};` gives `b` and `e`. Globs
/// (`*`) and `self` name nothing that can be checked, and are left out.
pub fn public_uses(source: &str) -> Vec<(usize, String)> {
    let code = blank_comments_and_literals(source);
    let mut found = Vec::new();
    for (start, _) in code.match_indices("pub use ") {
        if code[..start].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let tree_start = start + "pub use ".len();
        let tree_end = code[tree_start..].find(';').map_or(code.len(), |n| tree_start + n);
        let line = code[..start].matches('\n').count() + 1;
        for name in use_tree_names(&code[tree_start..tree_end]) {
            found.push((line, name));
        }
    }
    found
}

/// The names a use tree brings in: `a::{b, c::{d, e as f}}` gives b, d, f.
fn use_tree_names(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    if let (Some(open), true) = (tree.find('{'), tree.ends_with('}')) {
        let inner = &tree[open + 1..tree.len() - 1];
        let (mut names, mut depth, mut from) = (Vec::new(), 0usize, 0);
        for (at, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    names.extend(use_tree_names(&inner[from..at]));
                    from = at + 1;
                }
                _ => {}
            }
        }
        names.extend(use_tree_names(&inner[from..]));
        return names;
    }
    let words: Vec<&str> = tree.split_whitespace().collect();
    let name: &str = match words.as_slice() {
        [_, "as", alias] => alias,
        [path] => path.rsplit("::").next().unwrap_or(path),
        _ => return Vec::new(),
    };
    match name {
        "" | "*" | "self" | "_" => Vec::new(),
        name => vec![name.to_string()],
    }
}
