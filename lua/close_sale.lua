-- close_sale.lua: end a sale now, by the clock of the node that decides its
-- orders (an admin's early close). The window becomes [min(start, now),
-- min(end, now)): place_order.lua answers "ended" from the next call on.
-- Closing a closed or ended sale changes nothing.
--
-- KEYS[1]  sale hash  fs:{pid}:sale
--
-- Returns the sale's end (epoch ms), or nil when the sale is not open.

local w = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms')
if not w[1] then
  return nil
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start_ms, end_ms = tonumber(w[1]), tonumber(w[2])
if end_ms > now_ms then
  end_ms = now_ms
  if start_ms > now_ms then
    start_ms = now_ms
  end
  redis.call('HSET', KEYS[1], 'start_ms', start_ms, 'end_ms', end_ms)
end
return end_ms
