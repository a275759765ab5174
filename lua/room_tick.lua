-- room_tick.lua: admits a waiting room's places at the pace, and reads the
-- room. Any instance may call it at any time (about once a second per
-- sale it answers for): the places admitted (`served`) grow by the pace
-- times the time since they last grew, by Redis's clock, so more callers
-- never admit faster.
-- It admits only while the sale is in its window and has stock (a sold-out
-- sale admits nobody; when units come back, admission goes on from the
-- last place admitted), and never past the number of buyers who joined
-- (with nobody waiting, a newcomer is admitted within 1/pace seconds, not
-- all at once). Instances admit buyers up to the places admitted as they
-- read them, never further: so a reading that finds the stock gone or the
-- sale over leaves `served` where the last reading left it, which is
-- exactly the places buyers were told are admitted (the room's `admitted`
-- figure).
--
-- The pace follows the backend, between the operator's floor and ceiling:
-- when the oldest order not yet persisted (the group's oldest pending
-- entry, or the first one not yet read) is older than ARGV[5] ms, the
-- backend is strained and the pace halves (at most once a second, never
-- below the floor); otherwise it climbs back by a tenth of the ceiling per
-- second. With an active cap, the room admits only while fewer than `cap`
-- buyers hold an admission they have not used: the places admitted within
-- the last admission window (from a small log of how far the room had
-- admitted when) less the buyers among them who ordered (counted by the order
-- script per bucket of their admission's expiry); both kept only while a
-- cap is set.
--
-- KEYS[1]  sale hash  fs:{pid}:sale     start_ms, end_ms, room_admission_ms, room_key, initial,
--                                       paused_ms, last_pause_ms, last_resume_ms
-- KEYS[2]  stock      fs:{pid}:stock
-- KEYS[3]  room hash  fs:{pid}:room     ceiling, served, at_ms, early, late, floor, cap,
--                                       pace, adj_ms, limit, pow; rate: the ceiling's
--                                       earlier name (read when ceiling is missing:
--                                       a room an earlier version opened);
--                                       served_at: "<ms>:<served>", when the room
--                                       admitted up to `served` (at_ms moves on at
--                                       every call, `served` not always: caught up
--                                       with the joiners, paused, stopped by the cap)
-- KEYS[4]  orders     fs:{pid}:orders   (read: the oldest order not yet persisted)
-- KEYS[5]  room log   fs:{pid}:room_log list of "at_ms:served", newest first
-- KEYS[6]  room used  fs:{pid}:room_used <admission expiry / gap> -> buyers who ordered
--                                        (place_order.lua); expired buckets removed here
-- ARGV[1]  a new ceiling (buyers per second), or "" to keep it
-- ARGV[2]  a new floor, or "" to keep it
-- ARGV[3]  a new active cap (0: none), or "" to keep it
-- ARGV[4]  the workers' consumer group
-- (ARGV[7], ARGV[8]: a sale of several stock shards, the units left on
-- the others (moves in flight counted) and their initial units: the
-- room's stock is the sale's; then pairs of <bucket>, <buyers>: the
-- others' `room used`, summed by bucket (each shard counts the orders it
-- decides; the caller drops their expired buckets).)
-- ARGV[5]  strain: the age (ms) of the oldest unpersisted order that halves the pace
-- ARGV[6]  a new join difficulty (bits; 0: none), or "" to keep it
--
-- Returns {"room", start_ms, end_ms, admission_ms, key, pace (text),
-- served (text: fractional), at_ms, early, late, stock, now_ms, ceiling,
-- floor, cap, active, oldest unpersisted order's age ms (-1: none), the log
-- (with a cap; newest first), join difficulty, the pause (now, or the
-- last one: when it began, -1: never; when it ended, -1: not yet), the
-- gap of the log and of `room used`'s buckets (ms), when the room admitted
-- up to `served` (ms: an admission runs from the moment its place was
-- admitted)}, or
-- {"no_sale"}, {"no_room"}.

local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'room_admission_ms', 'room_key',
  'initial', 'paused_ms', 'last_pause_ms', 'last_resume_ms')
if not sale[1] then
  return {'no_sale'}
end
if not sale[4] then
  return {'no_room'}
end
local room = redis.call('HMGET', KEYS[3], 'ceiling', 'served', 'at_ms', 'early', 'late',
  'floor', 'cap', 'pace', 'adj_ms', 'pow', 'rate', 'served_at')
-- A room opened by an earlier version has its ceiling as `rate` only.
room[1] = room[1] or room[11]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start_ms, end_ms = tonumber(sale[1]), tonumber(sale[2])
local admission_ms = tonumber(sale[3])
local ceiling = tonumber(room[1] or '1')
local served = tonumber(room[2] or '0')
local at_ms = tonumber(room[3] or sale[1])
local early, late = tonumber(room[4] or '0'), tonumber(room[5] or '0')
-- A room opened before floors existed: the floor is the ceiling (no change).
local floor = tonumber(room[6] or room[1] or '1')
local cap = tonumber(room[7] or '0')
local pace = tonumber(room[8] or room[1] or '1')
local adj_ms = tonumber(room[9] or '0')
local pow = tonumber(room[10] or '0')
-- When the room admitted up to `served`: `served_at`'s, while it names
-- `served` as it stands (one an earlier version moved has none, or an
-- older one: then the last call's, written below).
local reached_ms
do
  local ms, at_served = string.match(room[12] or '', '^(%d+):(.+)$')
  if ms and at_served == room[2] then
    reached_ms = tonumber(ms)
  end
end
local stock = tonumber(redis.call('GET', KEYS[2]) or '0') + tonumber(ARGV[7] or '0')
local sold = tonumber(sale[5] or '0') + tonumber(ARGV[8] or '0') - stock

-- Buyers holding an unused admission (with a cap only): the places
-- admitted whose admission has not expired, less the buyers among them who
-- ordered (place_order.lua counts each buyer's first order in the bucket
-- of its admission's expiry). The log's entries are at least
-- max(1 s, window / 64) apart, so it holds about 66 of them, and the
-- buckets are as wide.
local active = 0
local log_gap = math.max(1000, math.floor(admission_ms / 64))
local log, log_read = {}, false
if cap > 0 then
  -- Places admitted after `since` have not expired. One valid when the
  -- last pause began got the pause's length again (sale::room::state):
  -- admitted after the window before the pause, and within the window
  -- and the pause before now.
  local since = now_ms - admission_ms
  local pause_from = tonumber(sale[6] or sale[7] or '')
  if pause_from then
    local pause_len = (sale[6] and now_ms or tonumber(sale[8] or now_ms)) - pause_from
    if since - pause_len < pause_from then
      since = math.max(since - pause_len, pause_from - admission_ms)
    end
  end
  local served_then = 0
  log, log_read = redis.call('LRANGE', KEYS[5], 0, -1), true
  for _, e in ipairs(log) do
    local a, s = string.match(e, '^(%d+):([%d.]+)$')
    if a and tonumber(a) <= since then
      served_then = tonumber(s)
      break
    end
  end
  -- Used: orders whose admission expires after now (a bucket counts once
  -- all of it is in the future: an order in the bucket now running out
  -- frees its place when the bucket has run out, at most a gap later).
  local used, gone = 0, {}
  local buckets = redis.call('HGETALL', KEYS[6])
  for j = 1, #buckets, 2 do
    local b = tonumber(buckets[j])
    if b * log_gap > now_ms then
      used = used + tonumber(buckets[j + 1])
    elseif (b + 1) * log_gap <= now_ms then
      gone[#gone + 1] = buckets[j]
    end
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[6], unpack(gone))
  end
  for j = 9, #ARGV, 2 do
    if tonumber(ARGV[j]) * log_gap > now_ms then
      used = used + tonumber(ARGV[j + 1])
    end
  end
  active = math.max(0, math.floor(served) - math.floor(served_then) - used)
end

-- The oldest order not yet persisted: pending in the group, or not yet
-- read by it (stream ids are Redis's clock in ms).
local oldest = -1
local function id_ms(id)
  return tonumber(string.match(id or '', '^(%d+)-'))
end
local pending = redis.pcall('XPENDING', KEYS[4], ARGV[4])
if type(pending) == 'table' and not pending.err then
  local ms = pending[2] and id_ms(pending[2])
  if ms then
    oldest = ms
  end
  local groups = redis.call('XINFO', 'GROUPS', KEYS[4])
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do
      f[g[i]] = g[i + 1]
    end
    if f['name'] == ARGV[4] then
      local unread = redis.call('XRANGE', KEYS[4], '(' .. f['last-delivered-id'], '+', 'COUNT', 1)
      local ms = unread[1] and id_ms(unread[1][1])
      if ms and (oldest < 0 or ms < oldest) then
        oldest = ms
      end
    end
  end
end
local age = -1
if oldest >= 0 then
  age = math.max(0, now_ms - oldest)
end

local from = math.max(at_ms, start_ms)
if now_ms > from then
  -- Paused (pause_sale.lua): the line stands still, and admission goes on
  -- from the last place admitted at the resume.
  if stock > 0 and now_ms < end_ms and not sale[6] then
    local paced = pace * (now_ms - from) / 1000
    local moved = paced
    if cap > 0 then
      moved = math.min(moved, math.max(0, cap - active))
    end
    local before = served
    served = math.min(served + moved, early + late)
    -- The places just admitted hold their admission from now.
    active = active + math.floor(served) - math.floor(before)
    if served > before then
      -- Stopped short of the pace (by the joiners' count, or the cap), the
      -- room got there before now: at the pace, from `served` before.
      reached_ms = now_ms
      if served - before < paced then
        reached_ms = from + math.floor((served - before) / pace * 1000)
      end
      redis.call('HSET', KEYS[3], 'served_at', reached_ms .. ':' .. tostring(served))
    end
  end
  if not reached_ms then
    reached_ms = at_ms
    redis.call('HSET', KEYS[3], 'served_at', reached_ms .. ':' .. tostring(served))
  end
  at_ms = now_ms
  redis.call('HSET', KEYS[3], 'served', tostring(served), 'at_ms', at_ms)
  -- The pace for what comes next.
  if now_ms >= start_ms and now_ms - adj_ms >= 1000 then
    if age > tonumber(ARGV[5]) then
      pace = math.max(floor, pace / 2)
    else
      local dt = math.min(now_ms - adj_ms, 10000) / 1000
      pace = math.min(ceiling, pace + ceiling * dt / 10)
    end
    redis.call('HSET', KEYS[3], 'pace', tostring(pace), 'adj_ms', now_ms)
  end
end
if ARGV[1] ~= '' then
  -- A new ceiling holds at once (the strain, if any, lowers it again).
  ceiling = tonumber(ARGV[1])
  pace = ceiling
  redis.call('HSET', KEYS[3], 'ceiling', ARGV[1], 'pace', ARGV[1])
end
if ARGV[2] ~= '' then
  floor = tonumber(ARGV[2])
  redis.call('HSET', KEYS[3], 'floor', ARGV[2])
end
if floor > ceiling then
  floor = ceiling
  redis.call('HSET', KEYS[3], 'floor', floor)
end
if pace < floor or pace > ceiling then
  pace = math.min(ceiling, math.max(floor, pace))
  redis.call('HSET', KEYS[3], 'pace', tostring(pace))
end
if ARGV[3] ~= '' then
  cap = tonumber(ARGV[3])
  redis.call('HSET', KEYS[3], 'cap', ARGV[3])
end
if ARGV[6] ~= '' then
  pow = tonumber(ARGV[6])
  redis.call('HSET', KEYS[3], 'pow', ARGV[6])
end
if cap > 0 then
  -- The last place the room may admit before the next tick (room_join.lua
  -- keeps to it).
  redis.call('HSET', KEYS[3], 'limit', tostring(served + math.max(0, cap - active)))
  -- How far the room had admitted when (returned: an admission's time runs
  -- from the moment its place was admitted).
  if not log_read then
    log = redis.call('LRANGE', KEYS[5], 0, -1)
  end
  local head_ms = tonumber(string.match(log[1] or '', '^(%d+):'))
  if not head_ms or now_ms - head_ms >= log_gap then
    local entry = now_ms .. ':' .. tostring(served)
    redis.call('LPUSH', KEYS[5], entry)
    redis.call('LTRIM', KEYS[5], 0, 70)
    table.insert(log, 1, entry)
    log[72] = nil
  end
else
  redis.call('HDEL', KEYS[3], 'limit')
  redis.call('DEL', KEYS[5], KEYS[6])
end
-- The count the gauges show. `active` is an upper bound (whole log steps:
-- a place admitted just before the window's edge counts until the next
-- entry passes it, a buyer who ordered counts until the bucket of their
-- admission's expiry has run out), which keeps admission on the safe side;
-- the room never admits beyond the cap, so more than the cap is never
-- held, and the count shown is at most the cap (after the cap is lowered,
-- buyers admitted before keep their admission: it reads the new cap until
-- enough of them have ordered or run out).
local shown = active
if cap > 0 and shown > cap then
  shown = cap
end
return {'room', start_ms, end_ms, admission_ms, sale[4], tostring(pace),
  tostring(served), at_ms, early, late, stock, now_ms, ceiling, floor, cap, shown, age, log, pow,
  tonumber(sale[6] or sale[7] or '-1'), tonumber((not sale[6]) and sale[8] or '-1'), log_gap,
  reached_ms or at_ms}
