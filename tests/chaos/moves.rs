//! The sharded sale's moves of units between its stock shards, as Redis
//! holds them (see `src/sale/shards.rs`): a move is recorded in flight in
//! its giving shard's `moves` hash by `move_take.lua`, applied where it
//! goes by `move_apply.lua` (the taker's `moved_in` hash: once per move),
//! and its record dropped (HDEL) once applied. A caller killed between the
//! two leaves the record until a search for units or the reconciler
//! finishes the move.
//!
//! Two views: the moves in flight now (read at once, every shard in one
//! MULTI), and the takes as Redis runs them (its MONITOR feed), which is
//! how the mid-move kill finds an API between a take and its apply.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use redis::Value;

use crate::checks::shard_keys;
use crate::load::Sale;

/// A move in flight: recorded where it left, its record not dropped yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flying {
    pub id: String,
    pub from: u16,
    pub to: u16,
    pub units: i64,
    /// Applied where it went already (its record not dropped yet); else
    /// its units are between the two shards.
    pub applied: bool,
}

/// Every move of `sale` in flight now: each shard's `moves` hash, and
/// whether the taker has the move, all read in one MULTI (one instant).
pub async fn in_flight(
    r: &mut redis::aio::MultiplexedConnection,
    sale: &Sale,
) -> redis::RedisResult<Vec<Flying>> {
    let keys = shard_keys(sale);
    let mut pipe = redis::pipe();
    pipe.atomic();
    for k in &keys {
        pipe.hgetall(&k.moves).hkeys(&k.moved_in);
    }
    let replies: Vec<Value> = pipe.query_async(r).await?;
    let mut moves = Vec::new();
    let mut moved_in: Vec<HashSet<String>> = Vec::new();
    for pair in replies.chunks_exact(2) {
        let m: HashMap<String, String> = redis::from_redis_value_ref(&pair[0])?;
        moves.push(m);
        moved_in.push(redis::from_redis_value_ref(&pair[1])?);
    }
    let mut flying = Vec::new();
    for (from, m) in moves.into_iter().enumerate() {
        for (id, what) in m {
            let (to, units) = what
                .split_once(':')
                .and_then(|(to, units)| Some((to.parse::<u16>().ok()?, units.parse().ok()?)))
                .unwrap_or((u16::MAX, 0));
            let applied = moved_in
                .get(usize::from(to))
                .is_some_and(|ids| ids.contains(&id));
            flying.push(Flying {
                id,
                from: from as u16,
                to,
                units,
                applied,
            });
        }
    }
    flying.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(flying)
}

/// How many moves the sale's shards ever gave (their `gave` hashes).
pub async fn given(
    r: &mut redis::aio::MultiplexedConnection,
    sale: &Sale,
) -> redis::RedisResult<usize> {
    let mut n = 0;
    for k in shard_keys(sale) {
        let len: usize = redis::cmd("HLEN").arg(&k.gave).query_async(r).await?;
        n += len;
    }
    Ok(n)
}

/// The moves of `sale` not finished (empty: every one given was applied
/// once where it went, and no record of one is left in flight).
pub async fn unfinished(
    r: &mut redis::aio::MultiplexedConnection,
    sale: &Sale,
) -> redis::RedisResult<Vec<String>> {
    let mut problems = Vec::new();
    for m in in_flight(r, sale).await? {
        problems.push(format!(
            "{}: move {} (shard {} -> {}, {} units, {}) left in flight at the end",
            sale.id,
            m.id,
            m.from,
            m.to,
            m.units,
            if m.applied { "applied" } else { "not applied" }
        ));
    }
    let keys = shard_keys(sale);
    let (mut gave, mut took) = (Vec::new(), Vec::new());
    for k in &keys {
        let g: HashMap<String, String> = redis::cmd("HGETALL").arg(&k.gave).query_async(r).await?;
        let t: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&k.moved_in)
            .query_async(r)
            .await?;
        gave.push(g);
        took.push(t);
    }
    let shard = |what: &str| what.split_once(':')?.0.parse::<usize>().ok();
    // Each side names the other shard: "<to>:<units>" where it was
    // given, "<from>:<units>" where it was applied.
    for (from, moves) in gave.iter().enumerate() {
        for (id, what) in moves {
            let units = what.split_once(':').map_or("?", |(_, u)| u);
            let there = shard(what).and_then(|to| took.get(to)?.get(id));
            if there.is_none_or(|t| t != &format!("{from}:{units}")) {
                problems.push(format!(
                    "{}: move {id} given by shard {from} ({what}) was not applied where it \
                     went (found {there:?})",
                    sale.id
                ));
            }
        }
    }
    for (to, moves) in took.iter().enumerate() {
        for (id, what) in moves {
            let given = shard(what).and_then(|from| gave.get(from)?.get(id));
            if given.is_none() {
                problems.push(format!(
                    "{}: move {id} applied on shard {to} ({what}) was never given",
                    sale.id
                ));
            }
        }
    }
    Ok(problems)
}

/// One thing a client did to a move, from Redis's MONITOR feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A take recorded a move in flight (`move_take.lua`'s HSET).
    Took { client: u16, id: String, from: u16 },
    /// An apply added a move's units where it went.
    Applied { client: u16, id: String },
    /// A move's in-flight record dropped.
    Dropped { client: u16, id: String },
}

/// Redis's MONITOR feed, reduced to the moves of one sale. `client` is the
/// local port of the client's connection (a process's, see [`owners`]).
/// Blocking: it runs on a thread of its own, so that the kill it is for
/// follows a take by microseconds, not by an async runtime's turn.
pub struct Monitor {
    conn: BufReader<TcpStream>,
    /// What was read of a line a read timeout cut.
    partial: Vec<u8>,
    /// Each shard's `moves` and `moved_in` keys, by shard.
    moves: HashMap<String, u16>,
    moved_in: HashMap<String, u16>,
    /// The client whose script the feed shows now (the commands a script
    /// runs follow its EVAL/EVALSHA line, tagged `lua`).
    scripting: Option<u16>,
    /// The time Redis gave the last line read (its clock, this machine's).
    at: Option<Duration>,
}

impl Monitor {
    pub fn connect(redis_url: &str, sale: &Sale) -> std::io::Result<Self> {
        let addr = redis_url.trim_start_matches("redis://");
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("no address in {redis_url}")))?;
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        stream.write_all(b"MONITOR\r\n")?;
        let mut conn = BufReader::new(stream);
        let mut ok = String::new();
        conn.read_line(&mut ok)?;
        if ok.trim_end() != "+OK" {
            return Err(std::io::Error::other(format!("MONITOR answered {ok:?}")));
        }
        let keys = shard_keys(sale);
        Ok(Self {
            conn,
            partial: Vec::new(),
            moves: (0..)
                .zip(&keys)
                .map(|(k, s)| (s.moves.clone(), k))
                .collect(),
            moved_in: (0..)
                .zip(&keys)
                .map(|(k, s)| (s.moved_in.clone(), k))
                .collect(),
            scripting: None,
            at: None,
        })
    }

    /// The next thing done to a move of the sale; `None` once `deadline`
    /// has passed first (Err: the feed ended).
    pub fn next(&mut self, deadline: Instant) -> std::io::Result<Option<Seen>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.conn.get_ref().set_read_timeout(Some(left))?;
            match self.conn.read_until(b'\n', &mut self.partial) {
                Ok(0) => return Err(std::io::Error::other("MONITOR feed closed")),
                Ok(_) => {
                    let line = String::from_utf8_lossy(&self.partial).into_owned();
                    self.partial.clear();
                    if let Some(seen) = self.read(line.trim_end()) {
                        return Ok(Some(seen));
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn read(&mut self, line: &str) -> Option<Seen> {
        // +1700000000.123456 [0 127.0.0.1:40266] "evalsha" "..." ...
        // +1700000000.123500 [0 lua] "HSET" "fs:{...}:moves" "<id>" "2:5"
        let (at, rest) = line.split_once(" [")?;
        self.at = at
            .trim_start_matches('+')
            .parse()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        let (who, args) = rest.split_once("] ")?;
        let who = who.split_once(' ')?.1;
        let args = words(args);
        let cmd = args.first()?.to_ascii_lowercase();
        let client = if who == "lua" {
            self.scripting?
        } else {
            let port = who.rsplit_once(':')?.1.parse().ok()?;
            self.scripting = matches!(cmd.as_str(), "eval" | "evalsha").then_some(port);
            port
        };
        let key = args.get(1)?;
        let id = args.get(2)?.clone();
        match cmd.as_str() {
            "hset" if who == "lua" => {
                let from = *self.moves.get(key)?;
                Some(Seen::Took { client, id, from })
            }
            "hsetnx" if who == "lua" => {
                self.moved_in.get(key)?;
                Some(Seen::Applied { client, id })
            }
            "hdel" => {
                self.moves.get(key)?;
                Some(Seen::Dropped { client, id })
            }
            _ => None,
        }
    }
}

/// A process killed as it took units from one of the sale's shards.
#[derive(Debug, Clone)]
pub struct Aimed {
    /// Its index in `pids`.
    pub process: usize,
    pub move_id: String,
    pub from: u16,
    /// From the start of the watch to the kill.
    pub after: Duration,
    /// From the take (by Redis's clock) to the kill (by ours).
    pub after_take: Option<Duration>,
}

/// Watches the sale's moves until one of `pids` (its connections to Redis,
/// see [`owners`]) takes units from one of its shards, and sends that
/// process SIGKILL at once, before it goes on to apply them (a race: it
/// has the take's answer when this has the feed's line; the kill's line
/// says who won). `None`: no such take before `limit`. Runs on a thread of
/// its own, real-time when allowed (root): on a machine of two cores, busy
/// with every process of the test, a thread of ordinary priority woke up
/// to a take too late for most applies. The caller reaps the process.
pub async fn kill_at_take(
    redis_url: &str,
    sale: &Sale,
    pids: &[Option<u32>],
    limit: Duration,
) -> std::io::Result<Option<Aimed>> {
    let (url, sale, pids) = (redis_url.to_owned(), sale.clone(), pids.to_vec());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        // SAFETY: plain calls on this thread's own scheduling; it ends
        // with the watch (it blocks on reads, never spins).
        unsafe {
            let param = libc::sched_param { sched_priority: 10 };
            libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param);
        }
        let _ = tx.send(watch_and_kill(&url, &sale, &pids, limit));
    });
    rx.await.expect("the MONITOR thread answers")
}

fn watch_and_kill(
    redis_url: &str,
    sale: &Sale,
    pids: &[Option<u32>],
    limit: Duration,
) -> std::io::Result<Option<Aimed>> {
    let t0 = Instant::now();
    let redis_port = redis_url
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no port in {redis_url}")))?;
    let mut monitor = Monitor::connect(redis_url, sale)?;
    let mut owned = owners(pids, redis_port);
    loop {
        let Some(seen) = monitor.next(t0 + limit)? else {
            return Ok(None);
        };
        let Seen::Took { client, id, from } = seen else {
            continue;
        };
        let Some(&process) = owned.get(&client) else {
            // A connection opened since (or a worker's): known next time.
            owned = owners(pids, redis_port);
            continue;
        };
        let Some(pid) = pids[process] else { continue };
        // SAFETY: a plain syscall; the pid is the caller's child, not
        // reaped yet, so it cannot name another process.
        let sent = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        if sent != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let now = std::time::UNIX_EPOCH.elapsed().ok();
        let after_take = now.zip(monitor.at).and_then(|(n, t)| n.checked_sub(t));
        return Ok(Some(Aimed {
            process,
            move_id: id,
            from,
            after: t0.elapsed(),
            after_take,
        }));
    }
}

/// A MONITOR line's arguments, unquoted (`"a" "b\"c"`: escapes kept as
/// they are but for `\"` and `\\`; keys and ids have none).
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                '"' => break,
                c => word.push(c),
            }
        }
        out.push(word);
    }
    out
}

/// Which process owns each TCP connection to `redis_port` on loopback, by
/// the connection's local port: the sockets of `/proc/net/tcp` whose remote
/// end is Redis, matched to the socket descriptors each pid holds.
pub fn owners(pids: &[Option<u32>], redis_port: u16) -> HashMap<u16, usize> {
    let mut port_of_inode = HashMap::new();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    for row in table.lines().skip(1) {
        let f: Vec<&str> = row.split_whitespace().collect();
        let (Some(local), Some(remote), Some(inode)) = (f.get(1), f.get(2), f.get(9)) else {
            continue;
        };
        let port = |a: &str| u16::from_str_radix(a.rsplit_once(':')?.1, 16).ok();
        if port(remote) == Some(redis_port)
            && let Some(local) = port(local)
        {
            port_of_inode.insert(format!("socket:[{inode}]"), local);
        }
    }
    let mut owners = HashMap::new();
    for (i, pid) in pids.iter().enumerate() {
        let Some(pid) = pid else { continue };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(port) = port_of_inode.get(target.to_string_lossy().as_ref())
            {
                owners.insert(*port, i);
            }
        }
    }
    owners
}
