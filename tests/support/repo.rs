//! The repository the tests belong to.

use std::path::PathBuf;

/// The crate root: where `Cargo.toml`, `config/`, `docs/` and `src/` are.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
