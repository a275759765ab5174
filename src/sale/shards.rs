//! A sale's stock shards: one hot sale beyond one Redis core.
//!
//! A sale opened with N > 1 shards keeps its keys under N hash tags: shard
//! 0 under the sale's own (`{pid}`, which also holds the waiting room),
//! shard k under `{pid~k}` ([`ProductId::shard`]); on a Redis Cluster
//! they spread over the masters. Each shard is a whole sale of its own to
//! the scripts (its window, its stock, its buyers, their idempotency
//! records, its stream and everything keyed by the orders it decided), so
//! `place_order.lua` stays one call to one node.
//!
//! - **A buyer has one home shard**, `user_id mod N`: their limit and
//!   idempotency keys live there, so both stay exact. The script refuses to
//!   decide a buyer of another shard (`{"shard", N}`); an instance that did
//!   not know the sale's N learns it from that answer and asks again.
//! - **The stock is split evenly at the open** (the first shards one unit
//!   more), and **units move to where the buyers are**: a shard that cannot
//!   serve an order asks [`Shards::refill`], which takes units from the
//!   shard that has most (half of them, at least what the order needs) by a
//!   move: recorded where they leave (`move_take.lua`), applied once where
//!   they arrive (`move_apply.lua`, keyed by the move's id), its record
//!   dropped once applied. A caller that dies between the two leaves the
//!   move recorded; the next search for units and the reconciler
//!   ([`Shards::finish_moves`]) apply it. No unit is created or lost.
//! - **No phantom sold-out**: the buyer hears `sold_out` only when two
//!   looks at every shard in a row found no unit, no move in flight, and no
//!   move made between them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use redis::AsyncCommands;

use super::core::Core;
use super::error::SaleError;
use super::lua::script;
use crate::domain::{MAX_SHARDS, OrderId, ProductId, UserId};

script!(MOVE_TAKE, "move_take");
script!(MOVE_APPLY, "move_apply");
script!(SHARD_LOOK, "shard_look");

/// How many looks at the shards a search for units makes at most before
/// it gives up (each look that finds units moves some).
const LOOKS: usize = 4;

/// Shard `k`'s name, the sale's count as this process knows it (read by
/// [`count`] before any of its shards is named).
fn name(core: &Core, product: &ProductId, k: u16) -> ProductId {
    product.shard(k, core.shards.known(product).unwrap_or(1))
}

/// A buyer's home shard among `n`.
pub fn home(user: UserId, n: u16) -> u16 {
    (user.get() % u64::from(n.max(1))) as u16
}

/// What one shard held at a look (`shard_look.lua`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardLook {
    /// Units left; `None`: the shard is not open.
    pub stock: Option<i64>,
    /// Moves this shard has given, ever.
    pub moves_out: i64,
    /// Moves given and not yet known to have arrived.
    pub in_flight: Vec<Move>,
    /// Units it opened with (its share of the stock; shard 0's counts the
    /// restocks).
    pub initial: i64,
}

/// Two shards of one sale, units going `from` one `to` the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub from: u16,
    pub to: u16,
}

/// The giving half of a move as the take script is asked it: the move's
/// `id`, up to `units`, leaving the giver `keep` at least; `redo`: the
/// move was given before and is taken again (the giver's master lost it).
struct TakeCall<'a> {
    route: Route,
    id: &'a str,
    units: i64,
    keep: i64,
    redo: bool,
}

/// A move of units from one shard to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub id: String,
    pub from: u16,
    pub to: u16,
    pub units: i64,
}

/// The shards handle.
#[derive(Clone)]
pub struct Shards {
    core: Arc<Core>,
}

impl Shards {
    pub(super) fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// The sale's shard count: from memory, else its hash (1 for a sale
    /// of one shard, or one not open).
    pub async fn count(&self, product: &ProductId) -> Result<u16, SaleError> {
        count(&self.core, product).await
    }

    /// Every shard of the sale, shard 0 (the sale) first.
    pub async fn of(&self, product: &ProductId) -> Result<Vec<ProductId>, SaleError> {
        let n = self.count(product).await?;
        Ok((0..n).map(|k| product.shard(k, n)).collect())
    }

    /// What each shard of the sale holds now, shard 0 first.
    pub async fn look(&self, product: &ProductId) -> Result<Vec<ShardLook>, SaleError> {
        let n = self.count(product).await?;
        look_all(&self.core, product, n).await
    }

    /// Applies every move in flight of the sale (recorded where its units
    /// left, not known to have arrived): what a caller that died mid-move
    /// left. Returns the moves finished.
    pub async fn finish_moves(&self, product: &ProductId) -> Result<usize, SaleError> {
        let n = self.count(product).await?;
        if n <= 1 {
            return Ok(0);
        }
        let mut finished = 0;
        for look in look_all(&self.core, product, n).await? {
            for m in &look.in_flight {
                finish(&self.core, product, m).await?;
                finished += 1;
            }
        }
        Ok(finished)
    }

    /// Both sides of every move checked and mended (see
    /// [`repair_moves`]): for the reconciler, after a failover.
    pub async fn repair_moves(&self, product: &ProductId) -> Result<usize, SaleError> {
        let n = self.count(product).await?;
        if n <= 1 {
            return Ok(0);
        }
        repair_moves(&self.core, product, n).await
    }

    /// Moves up to `units` from shard `from` to shard `to` (fewer when it
    /// has fewer): the take, then the apply. Returns the units moved.
    pub async fn move_units(
        &self,
        product: &ProductId,
        route: Route,
        units: i64,
    ) -> Result<i64, SaleError> {
        // (The shards' names need the count.)
        self.count(product).await?;
        let Some(m) = take(&self.core, product, route, units, 0).await? else {
            return Ok(0);
        };
        finish(&self.core, product, &m).await?;
        Ok(m.units)
    }

    /// Only the giving half of a move (for tests that stop a caller
    /// between the two).
    #[doc(hidden)]
    pub async fn take_only(
        &self,
        product: &ProductId,
        route: Route,
        units: i64,
    ) -> Result<i64, SaleError> {
        self.count(product).await?;
        let m = take(&self.core, product, route, units, 0).await?;
        Ok(m.map_or(0, |m| m.units))
    }
}

/// The sale's shard count (see [`Shards::count`]).
pub(super) async fn count(core: &Core, product: &ProductId) -> Result<u16, SaleError> {
    if let Some(n) = core.shards.known(product) {
        return Ok(n);
    }
    let sale = core.keys(product).sale;
    let n: Option<u16> = core
        .call(|mut c| async move { c.hget(&sale, "shards").await })
        .await?;
    let n = n.unwrap_or(1).clamp(1, MAX_SHARDS);
    core.shards.learn(product, n);
    Ok(n)
}

/// What a search for units ([`refill`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refill {
    /// Units may have arrived at the home shard, or the search could not
    /// settle (other buyers' searches moved units under it every look):
    /// the order is worth asking its home shard again (bounded by the
    /// order path's searches, then 503, never a `sold_out` it cannot
    /// prove).
    Again,
    /// Two looks in a row found fewer units than the order asks for in the
    /// whole sale (`left`, every shard's), no move in flight and none made
    /// between them: `0`, the sale is sold out; more, `insufficient_stock`.
    Settled { left: i64 },
}

/// Looks for units for an order of `need` units that shard `home` of a
/// sale of `n` shards could not serve, and moves them there; see
/// [`Refill`].
pub(super) async fn refill(
    core: &Core,
    product: &ProductId,
    n: u16,
    home: u16,
    need: u64,
) -> Result<Refill, SaleError> {
    let here = product.shard(home, n);
    // The buyers of this shard who got here together: one searches, the
    // others ask their shard again once it is done.
    let search = core.shards.search(&here);
    let _turn = search.lock().await;
    let need = i64::try_from(need).unwrap_or(i64::MAX);
    let mut last_counts: Option<Vec<i64>> = None;
    for _ in 0..LOOKS {
        let looks = look_all(core, product, n).await?;
        let home_stock = looks[usize::from(home)].stock.unwrap_or(0);
        if home_stock >= need {
            return Ok(Refill::Again);
        }
        // Moves in flight first (a caller died, or is between its take and
        // its apply): applying one twice does nothing.
        let in_flight: Vec<&Move> = looks.iter().flat_map(|l| &l.in_flight).collect();
        if !in_flight.is_empty() {
            let mut here_now = false;
            for m in in_flight {
                finish(core, product, m).await?;
                here_now |= m.to == home;
            }
            if here_now {
                return Ok(Refill::Again);
            }
            last_counts = None;
            continue;
        }
        // Units only where the whole sale has enough: a buyer who cannot
        // be served takes none (taking them would only send them round
        // between buyers who all lack some, to no one's order).
        let total: i64 = looks.iter().map(|l| l.stock.unwrap_or(0).max(0)).sum();
        let richest = looks
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != usize::from(home))
            .map(|(k, l)| (k as u16, l.stock.unwrap_or(0)))
            .max_by_key(|(_, stock)| *stock);
        if total >= need
            && let Some((from, stock)) = richest
            && stock > 0
        {
            // Half of what the richest has, at least what the order lacks:
            // the next buyers of this shard find units here, and the
            // richest keeps some for its own.
            let units = (need - home_stock).max((stock + 1) / 2).min(stock);
            if let Some(m) = take(core, product, Route { from, to: home }, units, 0).await? {
                finish(core, product, &m).await?;
                return Ok(Refill::Again);
            }
            last_counts = None;
            continue;
        }
        // Fewer units than asked in the whole sale, by this look. A unit
        // moving between two shards while the look went from one to the
        // other could have hidden from it: a second look that sees no move
        // made since (and none in flight) settles it. A unit then on a
        // shard was on it when the second look read it, or left a shard
        // read after it left: the second look's units are at least what
        // the sale has once it ends.
        let counts: Vec<i64> = looks.iter().map(|l| l.moves_out).collect();
        if last_counts.as_ref() == Some(&counts) {
            // None (sold out), or fewer than asked: `insufficient_stock`,
            // not `sold_out`, whatever the home shard answered first
            // (another buyer's search may have brought units since).
            return Ok(Refill::Settled { left: total });
        }
        last_counts = Some(counts);
    }
    // Every look found something moving (other buyers' searches, moves in
    // flight): nothing proves the sale sold out, so the order asks again
    // (a `sold_out` here was the phantom: issue 68).
    Ok(Refill::Again)
}

/// What every shard holds, shard 0 first (one call per shard: each is in
/// its own hash slot).
pub(super) async fn look_all(
    core: &Core,
    product: &ProductId,
    n: u16,
) -> Result<Vec<ShardLook>, SaleError> {
    let mut looks = Vec::with_capacity(usize::from(n));
    for k in 0..n {
        looks.push(look(core, product, k, n).await?);
    }
    Ok(looks)
}

/// Shard `k` of the sale's `n`, as one script reads it.
async fn look(core: &Core, product: &ProductId, k: u16, n: u16) -> Result<ShardLook, SaleError> {
    let keys = core.keys(&product.shard(k, n));
    let reply: (i64, i64, Vec<String>, i64) = core
        .call(|mut c| async move {
            SHARD_LOOK
                .key(&keys.stock)
                .key(&keys.moves)
                .key(&keys.sale)
                .invoke_async(&mut c)
                .await
        })
        .await?;
    let (stock, moves_out, in_flight, initial) = reply;
    let in_flight = in_flight
        .chunks_exact(2)
        .map(|pair| (pair[0].clone(), &pair[1]))
        .map(|(id, what)| {
            let parsed = what
                .split_once(':')
                .and_then(|(to, units)| Some((to.parse::<u16>().ok()?, units.parse().ok()?)));
            match parsed {
                Some((to, units)) if to < n => Ok(Move {
                    id,
                    from: k,
                    to,
                    units,
                }),
                _ => Err(SaleError::Corrupt(format!(
                    "move {id} of {product}: {what:?}"
                ))),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(ShardLook {
        stock: (stock >= 0).then_some(stock),
        moves_out,
        in_flight,
        initial,
    })
}

/// The giving half of a move: up to `units` from shard `from`, leaving it
/// `keep` at least. `None` when it had none to give. With
/// `REDIS_WAIT_REPLICAS`, only once its replicas have it (else
/// `NotReplicated`, the move left in flight: applied by the next search or
/// the reconciler, who check the giver again).
async fn take(
    core: &Core,
    product: &ProductId,
    route: Route,
    units: i64,
    keep: i64,
) -> Result<Option<Move>, SaleError> {
    let Route { from, to } = route;
    // Unique without coordination, as an order's id is.
    let id = OrderId::generate(&name(core, product, to)).into_string();
    let asked = TakeCall {
        route,
        id: &id,
        units,
        keep,
        redo: false,
    };
    let taken = take_call(core, product, asked).await?;
    Ok((taken > 0).then_some(Move {
        id,
        from,
        to,
        units: taken,
    }))
}

async fn take_call(
    core: &Core,
    product: &ProductId,
    asked: TakeCall<'_>,
) -> Result<i64, SaleError> {
    let TakeCall {
        route: Route { from, to },
        id,
        units,
        keep,
        redo,
    } = asked;
    let keys = core.keys(&name(core, product, from));
    let mut call = MOVE_TAKE.prepare_invoke();
    call.key(&keys.stock)
        .key(&keys.moves)
        .key(&keys.sale)
        .key(&keys.gave)
        .arg(id)
        .arg(to)
        .arg(units)
        .arg(keep)
        .arg(if redo { "redo" } else { "" });
    let (taken, replicated): (i64, _) = core.write(&keys.stock, call).await?;
    replicated?;
    Ok(taken)
}

/// The taking half of a move, then its in-flight record dropped where it
/// left (both idempotent: a move finished twice arrives once). With
/// `REDIS_WAIT_REPLICAS`, the record is dropped only once the taker's
/// replicas have the units.
async fn finish(core: &Core, product: &ProductId, m: &Move) -> Result<(), SaleError> {
    let taker = core.keys(&name(core, product, m.to));
    let mut call = MOVE_APPLY.prepare_invoke();
    call.key(&taker.stock)
        .key(&taker.moved_in)
        .key(&taker.sale)
        .arg(&m.id)
        .arg(m.units)
        .arg(m.from);
    let (applied, replicated): (i64, _) = core.write(&taker.stock, call).await?;
    replicated?;
    if applied < 0 {
        // The taking shard is gone (the sale retired): the record stays,
        // for the audit to count.
        return Ok(());
    }
    let moves = core.keys(&name(core, product, m.from)).moves;
    let id = m.id.clone();
    core.call(|mut c| async move { c.hdel::<_, _, ()>(&moves, &id).await })
        .await?;
    Ok(())
}

/// After a failover of any of the sale's masters: every move checked on
/// both sides. A move a giver logged is applied where it went (a lost
/// apply: idempotent); a move a taker has that its giver lost (the giver's
/// master failed over before its replica had the take) is taken again
/// there, exactly (its units were the taker's: the giver's stock shows
/// whether it sold them again meanwhile). Returns the moves repaired.
pub(super) async fn repair_moves(
    core: &Core,
    product: &ProductId,
    n: u16,
) -> Result<usize, SaleError> {
    let mut gave: Vec<HashMap<String, String>> = Vec::with_capacity(usize::from(n));
    let mut took: Vec<HashMap<String, String>> = Vec::with_capacity(usize::from(n));
    for k in 0..n {
        let keys = core.keys(&product.shard(k, n));
        let (g, t) = (keys.gave.clone(), keys.moved_in.clone());
        gave.push(
            core.call(|mut c| async move { c.hgetall(&g).await })
                .await?,
        );
        took.push(
            core.call(|mut c| async move { c.hgetall(&t).await })
                .await?,
        );
    }
    let parse = |what: &str| -> Option<(u16, i64)> {
        let (shard, units) = what.split_once(':')?;
        Some((shard.parse().ok().filter(|s| *s < n)?, units.parse().ok()?))
    };
    let mut repaired = 0;
    for (from, moves) in gave.iter().enumerate() {
        for (id, what) in moves {
            let Some((to, units)) = parse(what) else {
                return Err(SaleError::Corrupt(format!(
                    "move {id} of {product}: {what:?}"
                )));
            };
            if took[usize::from(to)].contains_key(id) {
                continue;
            }
            let m = Move {
                id: id.clone(),
                from: from as u16,
                to,
                units,
            };
            finish(core, product, &m).await?;
            repaired += 1;
        }
    }
    for (to, moves) in took.iter().enumerate() {
        for (id, what) in moves {
            let Some((from, units)) = parse(what) else {
                return Err(SaleError::Corrupt(format!(
                    "move {id} of {product}: {what:?}"
                )));
            };
            if gave[usize::from(from)].contains_key(id) {
                continue;
            }
            tracing::warn!(product_id = %product, move_id = %id, from, to, units, "a stock shard's master lost a move it gave; taken again");
            let asked = TakeCall {
                route: Route {
                    from,
                    to: to as u16,
                },
                id,
                units,
                keep: 0,
                redo: true,
            };
            take_call(core, product, asked).await?;
            repaired += 1;
        }
    }
    Ok(repaired)
}

/// The units of a sale across its shards, moves in flight counted (for
/// the sold-out mark's renewal and the audit); `None` when not open.
pub(super) async fn total_stock(
    core: &Core,
    product: &ProductId,
    n: u16,
) -> Result<Option<i64>, SaleError> {
    let looks = look_all(core, product, n).await?;
    if looks[0].stock.is_none() {
        return Ok(None);
    }
    let stock: i64 = looks.iter().filter_map(|l| l.stock).sum();
    Ok(Some(stock + in_flight(core, product, &looks).await?))
}

/// What the waiting room, which lives on shard 0 and counts the whole
/// sale, needs of a sale's other stock shards (nothing for a sale of one
/// shard: no Redis call once its count is known).
#[derive(Debug, Default, Clone)]
pub(super) struct Elsewhere {
    /// The other shards' count (0: a sale of one).
    pub shards: u16,
    /// Units left on shards 1.. (their moves in flight counted).
    pub units: i64,
    /// Their initial units.
    pub initial: i64,
    /// Buyers who ordered on them with an admission counted against an
    /// active cap, by bucket of the admission's expiry (their `room_used`,
    /// summed: each shard counts the orders it decides).
    pub used: BTreeMap<i64, i64>,
}

/// `used`: whether to read the other shards' `room_used` too (the room's
/// tick; a buyer's join needs only the units).
pub(super) async fn elsewhere(
    core: &Core,
    product: &ProductId,
    used: bool,
) -> Result<Elsewhere, SaleError> {
    let n = count(core, product).await?;
    let mut out = Elsewhere::default();
    for k in 1..n {
        let l = look(core, product, k, n).await?;
        out.units += l.stock.unwrap_or(0) + l.in_flight.iter().map(|m| m.units).sum::<i64>();
        out.initial += l.initial;
        if !used {
            continue;
        }
        let room_used = core.keys(&name(core, product, k)).room_used;
        let used: HashMap<i64, i64> = core
            .call(|mut c| async move { c.hgetall(&room_used).await })
            .await?;
        for (bucket, buyers) in used {
            *out.used.entry(bucket).or_default() += buyers;
        }
    }
    out.shards = n.saturating_sub(1);
    Ok(out)
}

/// Drops the `room_used` buckets of shards 1.. that ran out by `now_ms`
/// (`bucket_ms` wide, as `room_tick.lua` drops shard 0's).
pub(super) async fn drop_used(
    core: &Core,
    product: &ProductId,
    elsewhere: &Elsewhere,
    now_ms: i64,
    bucket_ms: i64,
) -> Result<(), SaleError> {
    let gone: Vec<i64> = elsewhere
        .used
        .keys()
        .copied()
        .filter(|b| (b + 1) * bucket_ms <= now_ms)
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let n = elsewhere.shards + 1;
    for k in 1..n {
        let room_used = core.keys(&name(core, product, k)).room_used;
        let gone = gone.clone();
        core.call(|mut c| async move { c.hdel::<_, _, ()>(&room_used, &gone).await })
            .await?;
    }
    Ok(())
}

/// A sale of several stock shards: moves units from shards 1.. to shard 0
/// until it holds `units` (or every shard gave what it had), for a restock
/// that takes units away, which shard 0 decides. Nothing for a sale of one
/// shard (no Redis call once its count is known).
pub(super) async fn gather(core: &Core, product: &ProductId, units: i64) -> Result<(), SaleError> {
    let n = count(core, product).await?;
    if n <= 1 {
        return Ok(());
    }
    let looks = look_all(core, product, n).await?;
    let mut short = units - looks[0].stock.unwrap_or(0);
    for (k, look) in (1..n).zip(&looks[1..]) {
        let have = look.stock.unwrap_or(0);
        if short <= 0 {
            break;
        }
        if have <= 0 {
            continue;
        }
        if let Some(m) = take(core, product, Route { from: k, to: 0 }, short.min(have), 0).await? {
            finish(core, product, &m).await?;
            short -= m.units;
        }
    }
    Ok(())
}

/// The units of the moves in flight at `looks` that have not arrived (a
/// move applied whose record is not yet dropped counts where it arrived).
pub(super) async fn in_flight(
    core: &Core,
    product: &ProductId,
    looks: &[ShardLook],
) -> Result<i64, SaleError> {
    let mut units = 0;
    for m in looks.iter().flat_map(|l| &l.in_flight) {
        let moved_in = core.keys(&name(core, product, m.to)).moved_in;
        let id = m.id.clone();
        let arrived: bool = core
            .call(|mut c| async move { c.hexists(&moved_in, &id).await })
            .await?;
        if !arrived {
            units += m.units;
        }
    }
    Ok(units)
}
