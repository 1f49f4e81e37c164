//! The `pub fn`s of a Rust file, and the names it
//! re-exports with `pub use`, read with syn: what the `stubs` check compares
//! and `cargo workbook` lists. Unit tests: xtask/tests/pub_fns.rs.
//!
//! syn parses a file as the compiler does, so a brace or the words `pub fn`
//! inside a comment or a string (a `todo!("...")` message) never count as
//! code; proc-macro2's span locations give each piece its line, for
//! messages that name file:line.

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::{Attribute, Block, Expr, ImplItemFn, ItemFn, ItemUse, Lit, Macro, Meta, Signature, Stmt, UseTree};

/// One `pub fn` of a file: a free function, or a method of an `impl`.
pub struct PubFn {
    pub name: String,
    /// 1-based line of its `pub`.
    pub line: usize,
    /// Its doc comment, one (1-based line, text after `///`) per line.
    pub doc: Vec<(usize, String)>,
    /// From `pub` to the end of the signature (its where clause included),
    /// as written, whitespace collapsed: what messages show.
    pub signature: String,
    /// The signature's tokens without the trailing commas that rustfmt adds
    /// when it wraps a line: two signatures are the same when these are.
    pub canonical: String,
    pub body: Block,
}

/// What [`read`] finds in a file, in file order.
#[derive(Default)]
pub struct RustFile {
    pub fns: Vec<PubFn>,
    /// Each name a `pub use` brings in, with the 1-based line of its `pub`:
    /// `pub use a::{b, c::d as e};` gives `b` and `e`. Globs (`*`), `self`
    /// and `_` name nothing that can be checked, and are left out.
    pub uses: Vec<(usize, String)>,
}

/// The `pub fn`s and `pub use`s of `source`, or where and why it is not Rust
/// that syn can read (`line L, column C: ...`).
pub fn read(source: &str) -> Result<RustFile, String> {
    let file = syn::parse_file(source).map_err(|error| {
        let at = error.span().start();
        format!("line {}, column {}: {error}", at.line, at.column + 1)
    })?;
    let mut finder = Finder { source, found: RustFile::default() };
    finder.visit_file(&file);
    Ok(finder.found)
}

/// Walks the whole file, so that a `pub fn` inside an `impl` or a `mod`
/// counts as well.
struct Finder<'a> {
    source: &'a str,
    found: RustFile,
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_fn(&mut self, item: &'ast ItemFn) {
        self.add(&item.attrs, &item.vis, &item.sig, &item.block);
        visit::visit_item_fn(self, item);
    }

    fn visit_impl_item_fn(&mut self, item: &'ast ImplItemFn) {
        self.add(&item.attrs, &item.vis, &item.sig, &item.block);
        visit::visit_impl_item_fn(self, item);
    }

    fn visit_item_use(&mut self, item: &'ast ItemUse) {
        if let syn::Visibility::Public(pub_token) = &item.vis {
            let line = pub_token.span.start().line;
            self.found.uses.extend(use_names(&item.tree).into_iter().map(|name| (line, name)));
        }
    }
}

impl Finder<'_> {
    fn add(&mut self, attrs: &[Attribute], vis: &syn::Visibility, sig: &Signature, body: &Block) {
        let syn::Visibility::Public(pub_token) = vis else { return };
        let written = &self.source[pub_token.span.byte_range().start..sig.span().byte_range().end];
        self.found.fns.push(PubFn {
            name: sig.ident.to_string(),
            line: pub_token.span.start().line,
            doc: attrs.iter().filter_map(doc_line).collect(),
            signature: written.split_whitespace().collect::<Vec<_>>().join(" "),
            canonical: canonical(sig.to_token_stream()),
            body: body.clone(),
        });
    }
}

/// A `///` line as the attribute the compiler makes of it, `#[doc = "..."]`.
fn doc_line(attr: &Attribute) -> Option<(usize, String)> {
    let Meta::NameValue(pair) = &attr.meta else { return None };
    let Expr::Lit(syn::ExprLit { lit: Lit::Str(text), .. }) = &pair.value else { return None };
    pair.path.is_ident("doc").then(|| (attr.span().start().line, text.value().trim_end().to_string()))
}

/// Tokens as one string, a trailing comma dropped wherever it ends a group
/// or comes before a `>`: `f(\n    a: A,\n) -> B` and `f(a: A) -> B` come out
/// equal. (A one-element tuple `(T,)` then reads as `(T)`: no stub differs
/// from its solution by that alone.)
fn canonical(tokens: TokenStream) -> String {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut words = Vec::new();
    for (at, tree) in trees.iter().enumerate() {
        let closes = |next: Option<&TokenTree>| match next {
            None => true,
            Some(TokenTree::Punct(punct)) => punct.as_char() == '>',
            Some(_) => false,
        };
        match tree {
            TokenTree::Punct(punct) if punct.as_char() == ',' && closes(trees.get(at + 1)) => {}
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::None => ("", ""),
                };
                words.push(format!("{open}{}{close}", canonical(group.stream())));
            }
            other => words.push(other.to_string()),
        }
    }
    words.join(" ")
}

/// The names a use tree brings in: `a::{b, c::{d, e as f}}` gives b, d, f.
fn use_names(tree: &UseTree) -> Vec<String> {
    match tree {
        UseTree::Path(path) => use_names(&path.tree),
        UseTree::Name(name) if name.ident != "self" => vec![name.ident.to_string()],
        UseTree::Rename(rename) if rename.rename != "_" => vec![rename.rename.to_string()],
        UseTree::Group(group) => group.items.iter().flat_map(use_names).collect(),
        UseTree::Name(_) | UseTree::Rename(_) | UseTree::Glob(_) => vec![],
    }
}

impl PubFn {
    /// The message of each `todo!("...")` of the body, format arguments or
    /// not (outside other macros' arguments, which syn leaves unparsed).
    pub fn todo_messages(&self) -> Vec<String> {
        struct Todos(Vec<String>);
        impl<'ast> Visit<'ast> for Todos {
            fn visit_macro(&mut self, mac: &'ast Macro) {
                self.0.extend(todo_call(mac).map(|(message, _)| message));
            }
        }
        let mut todos = Todos(Vec::new());
        todos.visit_block(&self.body);
        todos.0
    }

    /// Whether the body is one `todo!("...")` with nothing else but
    /// comments: no other statement, no format arguments.
    pub fn body_is_one_todo(&self) -> bool {
        let mac = match self.body.stmts.as_slice() {
            [Stmt::Macro(statement)] => &statement.mac,
            [Stmt::Expr(Expr::Macro(expression), _)] => &expression.mac,
            _ => return false,
        };
        todo_call(mac).is_some_and(|(_, alone)| alone)
    }
}

/// The message of `todo!("...", ..)`, a plain `todo` called with parentheses
/// around a string literal and maybe format arguments; and whether the
/// literal is all there is.
fn todo_call(mac: &Macro) -> Option<(String, bool)> {
    let parenthesized = matches!(mac.delimiter, syn::MacroDelimiter::Paren(_));
    if !mac.path.is_ident("todo") || !parenthesized {
        return None;
    }
    let literal_then_rest = |input: syn::parse::ParseStream| {
        let message: syn::LitStr = input.parse()?;
        let rest: TokenStream = input.parse()?;
        Ok((message.value(), rest))
    };
    let (message, rest) = syn::parse::Parser::parse2(literal_then_rest, mac.tokens.clone()).ok()?;
    // `todo!("m",)` is the literal alone too: rustfmt adds that comma when it wraps.
    let alone = rest.into_iter().all(|tree| matches!(&tree, TokenTree::Punct(p) if p.as_char() == ','));
    Some((message, alone))
}
