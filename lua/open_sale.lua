-- open_sale.lua: load a product's sale into Redis (the original design's
-- "product to ongoing") and make sure its stream has the workers' consumer
-- group. Put-if-absent: opening an open sale changes nothing, so a retried or
-- repeated open can never reset stock that buyers already took.
--
-- KEYS[1]  sale hash      fs:{pid}:sale    start_ms, end_ms, limit, price, initial, opened_ms
-- KEYS[2]  stock          fs:{pid}:stock   units left (integer)
-- KEYS[3]  orders stream  fs:{pid}:orders
-- KEYS[4]  room hash      fs:{pid}:room    ceiling, floor, cap, pow, pace, served, at_ms, early, late
--                                          (not rate, the ceiling's earlier name: nothing writes it any
--                                          more; room_tick.lua and room_join.lua still read it when
--                                          ceiling is missing)
-- KEYS[5]  room log       fs:{pid}:room_log (room_tick.lua's; emptied here)
-- KEYS[6]  room used      fs:{pid}:room_used (place_order.lua's; emptied here)
-- ARGV[1]  stock to load (integer >= 0)
-- ARGV[2]  start_ms (epoch milliseconds)
-- ARGV[3]  end_ms (epoch milliseconds, > start_ms; the window is [start, end))
-- ARGV[4]  limit per user (integer >= 1)
-- ARGV[5]  unit price (decimal text, echoed into every order)
-- ARGV[6]  consumer group of the stream workers
-- ARGV[7]  waiting room: the ceiling (the highest pace, places admitted per
--          second; the pace starts there), or "" for no room
-- ARGV[8]  waiting room: how long an admission is valid (ms)
-- ARGV[9]  waiting room: how long before the start buyers may join (ms)
-- ARGV[10] waiting room: the sale's signing key (random hex, made by the caller)
-- ARGV[11] waiting room: the floor (the lowest pace under strain)
-- ARGV[12] waiting room: the active cap (0: none)
-- ARGV[13] waiting room: the join difficulty (bits; 0: none)
-- ARGV[14] paused since (epoch ms), or "": a sale the books hold paused
--          (rebuilt by `flashsale recover`) opens paused, in this step
-- ARGV[15] stock shards of the sale (integer >= 1; "" or 1: one, no field)
-- ARGV[16] this shard's number (0: the sale itself, which holds the room)
--
-- A sale of several stock shards is opened shard by shard (sale/shards.rs),
-- each with its share of the stock as `initial`.
--
-- Returns {opened, stock}: opened = 1 when this call loaded the sale,
-- 0 when it was already open; stock = the units left now.

-- The group reads from the stream's start ('0'), so no order is ever skipped.
-- BUSYGROUP (it exists already) is the expected answer on a repeated open.
local created = redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[6], '0', 'MKSTREAM')
if type(created) == 'table' and created.err and not string.find(created.err, 'BUSYGROUP') then
  return redis.error_reply(created.err)
end

if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1],
  'start_ms', ARGV[2], 'end_ms', ARGV[3], 'limit', ARGV[4],
  'price', ARGV[5], 'initial', ARGV[1], 'opened_ms', now_ms)
if ARGV[14] and ARGV[14] ~= '' then
  redis.call('HSET', KEYS[1], 'paused_ms', ARGV[14])
end
local shards = tonumber(ARGV[15] or '') or 1
local shard = ARGV[16] or '0'
if shards > 1 then
  redis.call('HSET', KEYS[1], 'shards', shards, 'shard', shard)
end
if ARGV[7] ~= '' then
  -- The room's fields are in the sale hash (read with the window); its
  -- moving state is a hash of its own, written by room_tick.lua (on shard
  -- 0 only: one line per sale, whatever its shards).
  redis.call('HSET', KEYS[1], 'room_admission_ms', ARGV[8],
    'room_early_ms', ARGV[9], 'room_key', ARGV[10])
end
if ARGV[7] ~= '' and shard == '0' then
  redis.call('DEL', KEYS[4], KEYS[5], KEYS[6])
  redis.call('HSET', KEYS[4], 'ceiling', ARGV[7], 'floor', ARGV[11], 'cap', ARGV[12],
    'pow', ARGV[13], 'pace', ARGV[7], 'served', 0, 'at_ms', ARGV[2], 'early', 0, 'late', 0)
end
redis.call('SET', KEYS[2], ARGV[1])
return {1, tonumber(ARGV[1])}
