//! Checks that no Rust or Lua file of `src/` is over 400 lines, so each stays one concept a
//! reader takes in at once; the one exception says why.

use std::path::Path;

const MOST_LINES: usize = 400;

/// Files allowed more, and why.
const LONGER: &[(&str, &str)] = &[(
    "py/config/mod.rs",
    "PyO3 takes one #[pymethods] block per class: LeaseConfig's constructor and its getters",
)];

#[test]
fn no_rust_or_lua_file_is_over_400_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut folders = vec![src.clone()];
    let mut over = Vec::new();
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if !path.extension().is_some_and(|ext| ext == "rs" || ext == "lua") {
                continue;
            }
            let name = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let lines = std::fs::read_to_string(&path)
                .expect("a source file")
                .lines()
                .count();
            if lines > MOST_LINES && !LONGER.iter().any(|(longer, _)| *longer == name) {
                over.push(format!("{name}: {lines} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over {MOST_LINES} lines (split by concept, or move tests to a `_tests.rs` file): {over:?}"
    );
}
