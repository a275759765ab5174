-- open_sale.lua: load a product's sale into Redis (the original design's
-- "product to ongoing"). Put-if-absent: opening an open sale changes nothing,
-- so a retried or repeated open can never reset stock that buyers already took.
--
-- KEYS[1]  sale hash   fs:{pid}:sale   start_ms, end_ms, limit, price, initial, opened_ms
-- KEYS[2]  stock       fs:{pid}:stock  units left (integer)
-- ARGV[1]  stock to load (integer >= 0)
-- ARGV[2]  start_ms (epoch milliseconds)
-- ARGV[3]  end_ms (epoch milliseconds, > start_ms; the window is [start, end))
-- ARGV[4]  limit per user (integer >= 1)
-- ARGV[5]  unit price (decimal text, echoed into every order)
--
-- Returns {opened, stock}: opened = 1 when this call loaded the sale,
-- 0 when it was already open; stock = the units left now.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1],
  'start_ms', ARGV[2], 'end_ms', ARGV[3], 'limit', ARGV[4],
  'price', ARGV[5], 'initial', ARGV[1], 'opened_ms', now_ms)
redis.call('SET', KEYS[2], ARGV[1])
return {1, tonumber(ARGV[1])}
