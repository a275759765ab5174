-- sale_clock.lua: the sale's window and the clock of the Redis node that
-- decides its orders (a Redis Cluster's nodes each have their own clock).
-- Read in the background by each API instance, about once a second while
-- orders come, to answer "not started" / "ended" without asking Redis.
--
-- KEYS[1]  sale hash  fs:{pid}:sale
--
-- Returns {seconds, microseconds, start_ms, end_ms}, or {seconds,
-- microseconds} when the sale is not open.

local t = redis.call('TIME')
local w = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms')
if not w[1] then
  return {tonumber(t[1]), tonumber(t[2])}
end
return {tonumber(t[1]), tonumber(t[2]), tonumber(w[1]), tonumber(w[2])}
