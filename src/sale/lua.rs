//! The Lua scripts in `lua/`: [`script!`] declares one, loaded once per
//! process. `redis::Script` sends `EVALSHA` and loads the script again when
//! Redis answers `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`), so the
//! text travels once per server, not per call. Each script's Rust wrapper,
//! and the decoder of its reply, lives beside the handle that calls it.

/// `script!(NAME, "file")`: a `static NAME: LazyLock<redis::Script>` of
/// `lua/<file>.lua`.
macro_rules! script {
    ($name:ident, $file:literal) => {
        static $name: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/lua/",
                $file,
                ".lua"
            )))
        });
    };
}

pub(super) use script;
