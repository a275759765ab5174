-- room_tick.lua: moves a waiting room's "now serving" line on, and reads
-- the room. Any instance may call it at any time (about once a second per
-- sale it answers for): the line moves by the rate times the time since it
-- last moved, by Redis's clock, so more callers never move it faster.
-- It moves only while the sale is in its window and has stock (a sold-out
-- sale admits nobody; when units come back, admission goes on from where
-- the line stood), and never past the number of buyers who joined (with
-- nobody waiting, a newcomer is admitted within 1/rate seconds, not all at
-- once). Instances admit buyers up to the line as they read it, never
-- further: so a reading that finds the stock gone or the sale over leaves
-- the line where the last reading left it, which is exactly the places
-- buyers were told are admitted (the room's `admitted` figure).
--
-- KEYS[1]  sale hash  fs:{pid}:sale   start_ms, end_ms, room_admission_ms, room_key
-- KEYS[2]  stock      fs:{pid}:stock
-- KEYS[3]  room hash  fs:{pid}:room   rate, served, at_ms, early, late
-- ARGV[1]  a new rate (buyers per second) from now on, or "" to keep it
--
-- Returns {"room", start_ms, end_ms, admission_ms, key, rate,
-- served (text: fractional), at_ms, early, late, stock, now_ms}, or
-- {"no_sale"}, {"no_room"}.

local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'room_admission_ms', 'room_key')
if not sale[1] then
  return {'no_sale'}
end
if not sale[4] then
  return {'no_room'}
end
local room = redis.call('HMGET', KEYS[3], 'rate', 'served', 'at_ms', 'early', 'late')
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start_ms, end_ms = tonumber(sale[1]), tonumber(sale[2])
local rate = tonumber(room[1] or '1')
local served = tonumber(room[2] or '0')
local at_ms = tonumber(room[3] or sale[1])
local early, late = tonumber(room[4] or '0'), tonumber(room[5] or '0')
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
local from = math.max(at_ms, start_ms)
if now_ms > from then
  if stock > 0 and now_ms < end_ms then
    local moved = rate * (now_ms - from) / 1000
    served = math.min(served + moved, early + late)
  end
  at_ms = now_ms
  redis.call('HSET', KEYS[3], 'served', tostring(served), 'at_ms', at_ms)
end
if ARGV[1] ~= '' then
  rate = tonumber(ARGV[1])
  redis.call('HSET', KEYS[3], 'rate', ARGV[1])
end
return {'room', start_ms, end_ms, tonumber(sale[3]), sale[4], rate,
  tostring(served), at_ms, early, late, stock, now_ms}
