//! A Rust file as tokens, lexed by proc-macro2,
//! for the checks that look for paths in code (layering, seams): a path
//! written over several lines (a use group rustfmt wrapped) is one run of
//! tokens, and a string or a comment is never code. The code blocks of doc
//! comments are code too (rustdoc compiles them) and are lexed apart.
//! Unit tests: xtask/tests/layering_check.rs.

use std::str::FromStr;

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};

/// Tokens and where their lines are in the file.
pub struct Code {
    pub tokens: TokenStream,
    /// For a doc comment's code block, the file's line of each of its
    /// lines; `None` for the file itself.
    lines: Option<Vec<usize>>,
}

impl Code {
    /// The 1-based line of the file where `span` starts.
    pub fn line(&self, span: Span) -> usize {
        let line = span.start().line;
        match &self.lines {
            None => line,
            Some(lines) => lines.get(line.saturating_sub(1)).copied().unwrap_or(0),
        }
    }
}

/// `text` lexed: the code itself, then each Rust code block of its doc
/// comments. Doc comments are left out of the first (see [`levels`]).
pub fn lex(text: &str) -> Result<Vec<Code>, String> {
    let tokens = TokenStream::from_str(text).map_err(|error| {
        let at = error.span().start();
        format!("line {}, column {}: {error}", at.line, at.column + 1)
    })?;
    let mut doc_lines = Vec::new();
    collect_doc_lines(&tokens, &mut doc_lines);
    let mut found = vec![Code { tokens, lines: None }];
    found.extend(doc_examples(&doc_lines));
    Ok(found)
}

/// Each run of tokens between a group's delimiters (and the file's top
/// level), in source order, without doc comments (`#[doc = ..]`, which is
/// what `///` and `//!` lex to): they are prose, or examples that [`lex`]
/// returns apart.
pub fn levels(tokens: &TokenStream) -> Vec<Vec<TokenTree>> {
    let mut found = Vec::new();
    let mut pending = vec![tokens.clone()];
    while let Some(stream) = pending.pop() {
        let trees: Vec<TokenTree> = stream.into_iter().collect();
        let mut level = Vec::new();
        let mut at = 0;
        while at < trees.len() {
            if let Some(after) = doc_attribute_end(&trees, at) {
                at = after;
                continue;
            }
            if let TokenTree::Group(group) = &trees[at] {
                pending.push(group.stream());
            }
            level.push(trees[at].clone());
            at += 1;
        }
        found.push(level);
    }
    found
}

/// Where the doc attribute starting at `at` ends: `#` (`!`) `[doc = ".."]`.
fn doc_attribute_end(trees: &[TokenTree], at: usize) -> Option<usize> {
    let is_punct =
        |tree: Option<&TokenTree>, c: char| matches!(tree, Some(TokenTree::Punct(p)) if p.as_char() == c);
    if !is_punct(trees.get(at), '#') {
        return None;
    }
    let bracket = if is_punct(trees.get(at + 1), '!') { at + 2 } else { at + 1 };
    doc_text(trees.get(bracket)?).map(|_| bracket + 1)
}

/// The text of a doc attribute's brackets, `[doc = ".."]`.
fn doc_text(tree: &TokenTree) -> Option<String> {
    let TokenTree::Group(group) = tree else { return None };
    let inside: Vec<TokenTree> = group.stream().into_iter().collect();
    match (group.delimiter(), inside.as_slice()) {
        (Delimiter::Bracket, [TokenTree::Ident(doc), TokenTree::Punct(eq), TokenTree::Literal(text)])
            if doc == "doc" && eq.as_char() == '=' =>
        {
            match syn::Lit::new(text.clone()) {
                syn::Lit::Str(text) => Some(text.value()),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Every line of every doc comment, in source order, with its line in the
/// file (a `/** */` block's lines follow its first).
fn collect_doc_lines(tokens: &TokenStream, found: &mut Vec<(usize, String)>) {
    let trees: Vec<TokenTree> = tokens.clone().into_iter().collect();
    let mut at = 0;
    while at < trees.len() {
        if let Some(end) = doc_attribute_end(&trees, at) {
            let brackets = &trees[end - 1];
            let first = brackets.span().start().line;
            let text = doc_text(brackets).unwrap_or_default();
            found.extend(text.lines().enumerate().map(|(i, line)| (first + i, line.to_string())));
            at = end;
            continue;
        }
        if let TokenTree::Group(group) = &trees[at] {
            collect_doc_lines(&group.stream(), found);
        }
        at += 1;
    }
}

/// The code blocks of the doc lines whose fence says Rust (no language, or
/// only rustdoc's words such as `no_run`), lexed; a block that does not lex
/// is left out (it names no path either).
fn doc_examples(doc_lines: &[(usize, String)]) -> Vec<Code> {
    let mut found = Vec::new();
    let mut block: Option<(bool, Vec<usize>, String)> = None;
    for (line, text) in doc_lines {
        let trimmed = text.trim();
        match (&mut block, trimmed.strip_prefix("```")) {
            (None, Some(info)) => block = Some((is_rust(info), Vec::new(), String::new())),
            (Some(_), Some(_)) => {
                let (rust, lines, code) = block.take().expect("inside a block");
                if let (true, Ok(tokens)) = (rust, TokenStream::from_str(&code)) {
                    found.push(Code { tokens, lines: Some(lines) });
                }
            }
            (Some((_, lines, code)), None) => {
                // rustdoc's hidden lines (`# use x;`) lex as they are: a `#` more.
                lines.push(*line);
                code.push_str(text);
                code.push('\n');
            }
            (None, None) => {}
        }
    }
    found
}

/// Whether a fence's info string (after the backticks) is Rust for rustdoc.
fn is_rust(info: &str) -> bool {
    info.split(',').map(str::trim).all(|word| {
        matches!(word, "" | "rust" | "no_run" | "should_panic" | "ignore" | "compile_fail" | "test_harness")
            || word.starts_with("edition")
    })
}
