-- room_join.lua: a buyer joins a sale's waiting room, once. A buyer who has
-- joined before gets the same number back (joining again gains nothing).
-- Numbers: `e<n>` for the n-th buyer to join before the start (their place
-- is drawn at the start: see sale::room::places), `l<n>` for the n-th after
-- it (served in that order, after every early joiner).
--
-- KEYS[1]  sale hash    fs:{pid}:sale    start_ms, end_ms, room_early_ms, paused_ms
-- KEYS[2]  stock        fs:{pid}:stock
-- KEYS[3]  room hash    fs:{pid}:room    early, late (counts); pace, served, at_ms, limit,
--                                        served_at (the places admitted, as room_tick.lua
--                                        keeps them);
--                                        ceiling (or rate, its earlier name) when no pace
--                                        is set
-- KEYS[4]  joined hash  fs:{pid}:joined  user_id -> number
-- ARGV[1]  user_id
--
-- Returns {"joined", number, new (1/0)}, or {"no_sale"}, {"no_room"},
-- {"not_open", opens_ms}, {"ended"}, {"sold_out"}.

local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'room_early_ms', 'paused_ms')
if not sale[1] then
  return {'no_sale'}
end
if not sale[3] then
  return {'no_room'}
end
local known = redis.call('HGET', KEYS[4], ARGV[1])
if known then
  return {'joined', known, 0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start_ms = tonumber(sale[1])
if now_ms < start_ms - tonumber(sale[3]) then
  return {'not_open', start_ms - tonumber(sale[3])}
end
if now_ms >= tonumber(sale[2]) then
  return {'ended'}
end
-- (ARGV[2]: a sale of several stock shards, the units on the others.)
if tonumber(redis.call('GET', KEYS[2]) or '0') + tonumber(ARGV[2] or '0') <= 0 then
  return {'sold_out'}
end
local number
if now_ms < start_ms then
  number = 'e' .. redis.call('HINCRBY', KEYS[3], 'early', 1)
else
  -- The room first admits up to now among the buyers already in line (as
  -- room_tick.lua does), so that time nobody was waiting for is no
  -- credit for the newcomer: after a quiet hour, a burst of joiners still
  -- goes through at the pace.
  -- At the pace room_tick.lua set, and no further than its active cap lets
  -- the room admit before its next tick; not while the sale is paused (the
  -- line stands still: room_tick.lua).
  local room = redis.call('HMGET', KEYS[3], 'ceiling', 'served', 'at_ms', 'early', 'late', 'pace',
    'limit', 'rate')
  local before = tonumber(room[2] or '0')
  local at_ms = tonumber(room[3] or sale[1])
  local from = math.max(at_ms, start_ms)
  if now_ms > from and not sale[4] then
    local pace = tonumber(room[6] or room[1] or room[8] or '1')
    local paced = pace * (now_ms - from) / 1000
    local served = math.min(before + paced, tonumber(room[4] or '0') + tonumber(room[5] or '0'))
    if room[7] then
      served = math.max(before, math.min(served, tonumber(room[7])))
    end
    redis.call('HSET', KEYS[3], 'served', tostring(served), 'at_ms', now_ms)
    if served > before then
      -- When it got there (room_tick.lua's `served_at`): stopped short of
      -- the pace, before now.
      local reached_ms = now_ms
      if served - before < paced then
        reached_ms = from + math.floor((served - before) / pace * 1000)
      end
      redis.call('HSET', KEYS[3], 'served_at', reached_ms .. ':' .. tostring(served))
    end
  end
  number = 'l' .. redis.call('HINCRBY', KEYS[3], 'late', 1)
end
redis.call('HSET', KEYS[4], ARGV[1], number)
return {'joined', number, 1}
