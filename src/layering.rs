//! Checks the claim of `lib.rs`: each module's `crate::` paths name only modules listed below it,
//! so the table of contents reads from what uses to what is used, with no circles.

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

/// The modules a file names through `crate::`.
fn named(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices("crate::").map(move |(at, found)| {
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
            for used in named(&text) {
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
