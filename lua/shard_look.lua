-- shard_look.lua: what one stock shard of a sale holds, read atomically,
-- for the order path's search for units (sale/shards.rs) and the audit.
--
-- KEYS[1]  stock   fs:{pid~k}:stock
-- KEYS[2]  moves   fs:{pid~k}:moves   move id -> "<to>:<units>", in flight
-- KEYS[3]  sale    fs:{pid~k}:sale
--
-- Returns {stock, moves_out, {move_id, "<to>:<units>", ...}, initial}; stock
-- -1 when the shard is not open.

local sale = redis.call('HMGET', KEYS[3], 'moves_out', 'initial')
if not sale[2] then
  return {-1, 0, {}, 0}
end
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
return {stock, tonumber(sale[1] or '0'), redis.call('HGETALL', KEYS[2]), tonumber(sale[2])}
