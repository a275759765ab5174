//! An error and its causes, for a log line.

/// An error and its causes, outermost first (`a: b: c`), for a log line.
/// Each layer's error says only what failed at its level (`redis`,
/// `mysql`), and its cause is its `source`: printed once, here.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            write!(f, ": {cause}")?;
            next = cause.source();
        }
        Ok(())
    }
}
