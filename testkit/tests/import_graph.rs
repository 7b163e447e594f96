//! The import graph of every crate in the workspace, file by file: no file may
//! reach itself through `use` statements and paths (`crate::`, `super::`, `self::`
//! and child modules). The one kind of circle allowed is a type's inherent `impl`
//! split across sibling files (a protocol `Session` whose command families each
//! have a file), because those files are one type's methods, not layers.
//!
//! Why a test of our own and not a tool: it needs no network nor nightly, runs in
//! CI with the rest, and its rule (the `impl` exception) is ours.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// One source file as a module: its path (`imap::session`), its import edges and
/// the types it has inherent `impl` blocks for.
struct FileModule {
    targets: BTreeSet<Vec<String>>,
    impls: BTreeSet<String>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().contains("test"))
    })
}

/// Collects every path that leaves the file: `use` trees and paths in code.
struct Collector<'a> {
    module: &'a [String],
    children: &'a BTreeSet<String>,
    out: BTreeSet<Vec<String>>,
    impls: BTreeSet<String>,
}

impl Collector<'_> {
    /// Turns a path's segments into an absolute module path, when it names
    /// something of this crate.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "self" => Some(self.module.iter().chain(&segments[1..]).cloned().collect()),
            "super" => {
                let mut base = self.module.to_vec();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                Some(base.into_iter().chain(rest.iter().cloned()).collect())
            }
            name if self.children.contains(name) => {
                Some(self.module.iter().chain(segments).cloned().collect())
            }
            _ => None,
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.record(prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    fn record(&mut self, segments: Vec<String>) {
        if let Some(abs) = self.absolute(&segments) {
            self.out.insert(abs);
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_cfg_test(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_cfg_test(&i.attrs) {
            return;
        }
        if i.trait_.is_none()
            && let syn::Type::Path(p) = &*i.self_ty
            && let Some(last) = p.path.segments.last()
        {
            self.impls.insert(last.ident.to_string());
        }
        syn::visit::visit_item_impl(self, i);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.record(segments);
        }
        syn::visit::visit_path(self, p);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/imap/mod.rs` → `["imap"]`, `src/imap/fetch.rs` → `["imap", "fetch"]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

fn modules(src: &Path) -> BTreeMap<Vec<String>, FileModule> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // Binaries under src/bin are crates of their own.
    files.retain(|f| !f.strip_prefix(src).unwrap().starts_with("bin"));
    let paths: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src, f)).collect();
    let mut out = BTreeMap::new();
    for file in files {
        let module = module_of(src, &file);
        let children: BTreeSet<String> = paths
            .iter()
            .filter(|p| p.len() == module.len() + 1 && p.starts_with(&module))
            .map(|p| p.last().unwrap().clone())
            .collect();
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut c =
            Collector { module: &module, children: &children, out: BTreeSet::new(), impls: BTreeSet::new() };
        c.visit_file(&ast);
        let (targets, impls) = (c.out, c.impls);
        out.insert(module, FileModule { targets, impls });
    }
    out
}

/// The longest module prefix of `path` that is a file.
fn file_of<'a>(mods: &'a BTreeMap<Vec<String>, FileModule>, path: &[String]) -> Option<&'a Vec<String>> {
    (0..=path.len()).rev().find_map(|n| mods.get_key_value(&path[..n]).map(|(k, _)| k))
}

/// Strongly connected components of more than one file (Tarjan, iterative: the
/// graph's depth is the crate's, but the test should not be what recurses).
fn circles(src: &Path) -> Vec<Vec<String>> {
    let mods = modules(src);
    let names: Vec<&Vec<String>> = mods.keys().collect();
    let index_of: BTreeMap<&Vec<String>, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    // Sibling files adding inherent methods to one type are that type, one node:
    // a session whose command families each have a file is not a circle.
    let mut group: Vec<usize> = (0..names.len()).collect();
    let mut owner: BTreeMap<(&[String], &String), usize> = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let parent = &n[..n.len().saturating_sub(1)];
        for ty in &mods[*n].impls {
            let first = *owner.entry((parent, ty)).or_insert(group[i]);
            let (from, to) = (group[i], group[first]);
            for g in group.iter_mut() {
                if *g == from {
                    *g = to;
                }
            }
        }
    }
    // A module's files may use what their ancestors declare (the parent's shared
    // types, a crate root's): they are inside its scope. Every other use is an
    // edge, from the importing file's node to the imported file's.
    let mut edge_sets: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); names.len()];
    for (i, n) in names.iter().enumerate() {
        for t in mods[*n].targets.iter().filter_map(|t| file_of(&mods, t)) {
            let to = group[index_of[t]];
            if t != *n && !n.starts_with(t) && to != group[i] {
                edge_sets[group[i]].insert(to);
            }
        }
    }
    let edges: Vec<Vec<usize>> = edge_sets.into_iter().map(|e| e.into_iter().collect()).collect();
    let n = names.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut comps) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = edges[v].get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = stack.pop().unwrap();
                    on[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comps.push(comp);
                }
            }
        }
    }
    comps
        .into_iter()
        .map(|comp| {
            // Each file with the files of the circle it imports, so the failure says
            // which import to cut.
            let members = |c: usize| -> String {
                let files: Vec<String> =
                    (0..names.len()).filter(|&i| group[i] == c).map(|i| names[i].join("::")).collect();
                files.join(" + ")
            };
            let mut files: Vec<String> = comp
                .iter()
                .map(|&c| {
                    let into: Vec<String> =
                        edges[c].iter().filter(|t| comp.contains(t)).map(|&t| members(t)).collect();
                    format!("{} (imports {})", members(c), into.join(", "))
                })
                .collect();
            files.sort();
            files
        })
        .collect()
}

fn workspace_crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m))
        .collect()
}

#[test]
fn no_crate_has_an_import_circle() {
    let crates = workspace_crates();
    assert!(crates.len() >= 5, "workspace members read from Cargo.toml: {crates:?}");
    let mut found = Vec::new();
    for krate in crates {
        for comp in circles(&krate.join("src")) {
            found.push(format!("{}:\n  {}", krate.display(), comp.join("\n  ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The checker itself, on a crate written for it: it must see a circle through a
/// parent's re-export and a child's `super::`, and must allow a split `impl`.
#[test]
fn the_checker_sees_a_circle_and_allows_a_split_impl() {
    let dir = std::env::temp_dir().join(format!("import-graph-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::create_dir_all(src.join("s")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod s;").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod c; pub use c::C; pub struct A;").unwrap();
    std::fs::write(src.join("a/c.rs"), "pub struct C(crate::b::B);").unwrap();
    std::fs::write(src.join("b.rs"), "pub struct B(Box<super::a::A>);").unwrap();
    std::fs::write(src.join("s/mod.rs"), "mod one; mod two;").unwrap();
    std::fs::write(src.join("s/one.rs"), "pub struct S; impl S { fn f(&self) { self.g() } } use super::two;")
        .unwrap();
    std::fs::write(src.join("s/two.rs"), "impl super::one::S { pub fn g(&self) {} }").unwrap();
    let found = circles(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3, "a -> a::c -> b -> a: {found:?}");
}
