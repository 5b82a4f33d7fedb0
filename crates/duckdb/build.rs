// See [build-dependencies] in Cargo.toml: present only to align feature
// unification of DuckDB's build-script dependencies across cargo features.
fn main() {}
