//! Which release this process is: its version (semver, the crate's) and
//! the commit it was built from (`build.rs`). Shown by `flashsale
//! --version`, the `flashsale_build_info` gauge and the registry of
//! processes the dashboard lists (docs/operations.md "Upgrading").

/// The release's version, as `Cargo.toml` and the CHANGELOG name it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit it was built from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("FLASHSALE_COMMIT");

/// `<version> (commit <commit>)`: what `flashsale --version` prints after
/// the name.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("FLASHSALE_COMMIT"),
    ")"
);
