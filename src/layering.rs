//! Checks the claim of `lib.rs`: each module's `crate::` paths name only modules listed below it,
//! so the table of contents reads from what uses to what is used, with no circles; and inside
//! each folder, its files' `super::` paths to one another go one way, with no circles either.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules in the order `lib.rs` declares them.
fn listed(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// Every Rust file of a module (its file, or its folder).
fn files_of(src: &Path, module: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{module}.rs"));
    if file.exists() {
        return vec![file];
    }
    let mut files = Vec::new();
    let mut folders = vec![src.join(module)];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a module folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The modules a file names through `prefix` (`crate::`, `super::`) at the start of a path.
fn named<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    let starts = |&(at, _): &(usize, &str)| !text[..at].ends_with("::");
    text.match_indices(prefix).filter(starts).map(move |(at, found)| {
        let rest = &text[at + found.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        &rest[..end]
    })
}

#[test]
fn every_module_uses_only_modules_listed_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let order = listed(&lib);
    let mut upward = Vec::new();
    for (place, module) in order.iter().enumerate() {
        for file in files_of(&src, module) {
            let text = std::fs::read_to_string(&file).expect("a source file");
            for used in named(&text, "crate::") {
                let at = order.iter().position(|m| m == used);
                if at.is_some_and(|at| at < place) {
                    let shown = file.strip_prefix(&src).unwrap_or(&file);
                    upward.push(format!("{} uses crate::{used}", shown.display()));
                }
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "these point up the list of lib.rs (move the module, or what it uses):\n{}",
        upward.join("\n")
    );
}

/// The modules a folder's `mod.rs` declares (`mod x;`, public or not), by name.
fn declared(mod_rs: &str) -> Vec<String> {
    mod_rs
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = match line.strip_prefix("pub") {
                Some(rest) => rest.trim_start_matches(|c| c != ' ').trim_start(),
                None => line,
            };
            line.strip_prefix("mod ")?.strip_suffix(';')
        })
        .map(str::to_owned)
        .collect()
}

/// Each folder's modules and the siblings each names through `super::`: `x.rs`, or `x/mod.rs`
/// for a folder `x/` (files a module includes by `#[path]`, its tests, are not siblings).
fn sibling_uses(src: &Path) -> Vec<(PathBuf, BTreeMap<String, Vec<String>>)> {
    let mut found = Vec::new();
    let mut folders = vec![src.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder").flatten() {
            if entry.path().is_dir() {
                folders.push(entry.path());
            }
        }
        let Ok(mod_rs) = std::fs::read_to_string(folder.join("mod.rs")) else {
            continue;
        };
        let modules = declared(&mod_rs);
        let mut uses = BTreeMap::new();
        for module in &modules {
            let file = folder.join(format!("{module}.rs"));
            let file = if file.exists() {
                file
            } else {
                folder.join(module).join("mod.rs")
            };
            let text = std::fs::read_to_string(&file).expect("a declared module's file");
            let mut used: Vec<String> = named(&text, "super::")
                .filter(|used| used != module && modules.iter().any(|m| m == used))
                .map(str::to_owned)
                .collect();
            used.sort();
            used.dedup();
            uses.insert(module.clone(), used);
        }
        found.push((folder, uses));
    }
    found
}

/// A circle of `uses`, as the modules along it, if there is one.
fn circle(uses: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        uses: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut circle = path[at..].to_vec();
            circle.push(module.to_owned());
            return Some(circle);
        }
        if done.iter().any(|m| m == module) {
            return None;
        }
        path.push(module.to_owned());
        for used in uses.get(module).into_iter().flatten() {
            if let Some(circle) = visit(used, uses, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.push(module.to_owned());
        None
    }
    let (mut path, mut done) = (Vec::new(), Vec::new());
    uses.keys()
        .find_map(|module| visit(module, uses, &mut path, &mut done))
}

#[test]
fn the_files_of_a_folder_use_one_another_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut circles: Vec<String> = sibling_uses(&src)
        .into_iter()
        .filter_map(|(folder, uses)| {
            let shown = folder.strip_prefix(&src).unwrap_or(&folder).display().to_string();
            circle(&uses).map(|circle| format!("{shown}/: {}", circle.join(" -> ")))
        })
        .collect();
    circles.sort();
    assert!(
        circles.is_empty(),
        "these files use one another through super:: (move what both use into a file below them):\n{}",
        circles.join("\n")
    );
}
