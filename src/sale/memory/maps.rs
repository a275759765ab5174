//! The maps the memory keeps.

/// The memory's tables, looked up several times per order answered: with
/// foldhash rather than std's SipHash, a fraction of the lookups' cost.
/// Seeded at random per table (its `quality` variant), as std's is, since
/// a buyer's mark can follow a request's user id (a `limit` refusal).
pub(super) type Map<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
pub(super) type Set<K> = std::collections::HashSet<K, foldhash::quality::RandomState>;
