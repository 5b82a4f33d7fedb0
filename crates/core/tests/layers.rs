//! The core's shape, checked: its top-level modules form layers, each using
//! only those before it, and no two modules anywhere import each other,
//! directly or around a cycle. Read from the source: every `crate::…` path
//! outside comments and test modules, and a module's relative paths into
//! the submodules it declares.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first.
const LAYERS: [&str; 7] = ["error", "job", "fingerprint", "engine", "run", "plans", "tools"];

/// Module path (`plans::merge::sql`) → file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["lib"] {
                continue;
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The code of a file without comments, string literals' contents and its
/// `#[cfg(test)]` modules.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().map(|l| l.trim_start()).filter(|l| !l.starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The modules a file's code names (`crate::a::b::Item` → the longest
/// prefix that is a module).
fn references(module: &str, code: &str, mods: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    // A module's own submodules, named by relative paths (`use rows::Rows`).
    for line in code.lines() {
        let decl = line.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
        let Some(name) = decl.strip_prefix("mod ").and_then(|d| d.strip_suffix(';')) else { continue };
        let child = format!("{module}::{name}");
        let used = code.match_indices(&format!("{name}::")).any(|(i, _)| {
            let before = code[..i].chars().next_back();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        });
        if used && mods.contains_key(&child) {
            out.insert(child);
        }
    }
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
        let mut found = None;
        for n in (1..=parts.len()).rev() {
            let candidate = parts[..n].join("::");
            if mods.contains_key(&candidate) {
                found = Some(candidate);
                break;
            }
        }
        // A `use crate::x::{a, b}` group: the prefix before the brace.
        if let Some(m) = found {
            out.insert(m);
        } else if let Some(first) = parts.first() {
            out.insert(format!("<root>::{first}"));
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    mods.iter()
        .map(|(m, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let refs = references(m, &code(&text), &mods).into_iter().filter(|r| r != m).collect();
            (m.clone(), refs)
        })
        .collect()
}

fn top(m: &str) -> &str {
    m.split("::").next().unwrap()
}

#[test]
fn every_module_sits_in_a_layer_and_uses_only_the_layers_before_it() {
    let g = graph();
    let mut wrong = Vec::new();
    for (m, refs) in &g {
        let Some(mine) = LAYERS.iter().position(|l| *l == top(m)) else {
            wrong.push(format!("{m}: not in a layer ({LAYERS:?})"));
            continue;
        };
        for r in refs {
            match LAYERS.iter().position(|l| *l == top(r)) {
                Some(theirs) if theirs <= mine => {}
                Some(_) => wrong.push(format!("{m} uses {r}, a layer above it")),
                None => wrong.push(format!("{m} uses {r}: through the crate root, not its module")),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every cycle of `g`, found by a depth-first search.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn visit(m: &str, g: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>, found: &mut Vec<String>) {
        if let Some(i) = path.iter().position(|p| p == m) {
            found.push(format!("cycle: {} -> {m}", path[i..].join(" -> ")));
            return;
        }
        if !done.insert(m.to_owned()) {
            return;
        }
        path.push(m.to_owned());
        for r in g.get(m).into_iter().flatten() {
            visit(r, g, path, done, found);
        }
        path.pop();
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for m in g.keys() {
        visit(m, g, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let found = cycles(&graph());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_reads_code_not_comments_or_tests() {
    // The checker itself, on a made-up tree.
    let mods: BTreeMap<String, PathBuf> =
        ["job", "job::spec", "run", "plans"].iter().map(|m| (m.to_string(), PathBuf::new())).collect();
    let refs = references("job", &code("mod spec;\npub use spec::Job;\nuse crate::plans::X;\n// crate::run::Y\nfn f() { crate::job::spec::Job::x() }"), &mods);
    assert_eq!(refs, ["job::spec", "plans"].iter().map(|s| s.to_string()).collect());
    let refs = references("run", &code("fn a() {}\n#[cfg(test)]\nmod tests { use crate::run::Z; }"), &mods);
    assert!(refs.is_empty());
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .iter()
        .map(|(m, r)| (m.to_string(), [r.to_string()].into_iter().collect()))
        .collect();
    assert_eq!(cycles(&g), ["cycle: a -> b -> c -> a"]);
}
