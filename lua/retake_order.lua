-- retake_order.lua: a payment that came after the order's payment timeout
-- cancelled it (its units given back to the sale) takes the units again,
-- when the sale can still sell them to this buyer: the same checks as
-- place_order.lua (the sale exists, its window by Redis TIME, the stock,
-- the buyer's allowance; not the waiting room: the buyer was admitted when
-- ordering). At most once per order: the retaken hash remembers it, so a
-- retried notification, or a second payment for the same order, takes
-- nothing more.
--
-- KEYS[1]  sale hash      fs:{pid}:sale
-- KEYS[2]  stock          fs:{pid}:stock
-- KEYS[3]  bought hash    fs:{pid}:bought    user_id -> units accepted
-- KEYS[4]  released set   fs:{pid}:released  order ids whose units went back
-- KEYS[5]  accepted hash  fs:{pid}:accepted  order_id -> order record (JSON)
-- KEYS[6]  retaken hash   fs:{pid}:retaken   order_id -> the cancel's time
-- ARGV[1]  order_id
-- ARGV[2]  user_id
-- ARGV[3]  quantity (integer >= 1)
-- ARGV[4]  the time of the cancel whose units come back (ms: the order's
--          `updated` in the books); a release of that cancel arriving later
--          gives nothing back (release_stock.lua)
--
-- Returns {"taken", stock}: the units are the order's again (now, or by an
-- earlier call); or one of {"no_sale"} {"ended"} {"sold_out"} {"limit"}
-- {"unknown"} (this Redis does not hold the order: after a loss, before
-- recovery).

if redis.call('HEXISTS', KEYS[6], ARGV[1]) == 1 then
  -- Written again (unchanged) for a WAIT to follow.
  redis.call('HSET', KEYS[6], ARGV[1], redis.call('HGET', KEYS[6], ARGV[1]))
  return {'taken', tonumber(redis.call('GET', KEYS[2]) or '0')}
end
local sale = redis.call('HMGET', KEYS[1], 'start_ms', 'end_ms', 'limit')
if not sale[1] then
  return {'no_sale'}
end
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then
  return {'unknown'}
end
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 then
  -- The units never came back here (a failover lost the release): they
  -- are still the order's, and that cancel's release must not give them.
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[4])
  return {'taken', tonumber(redis.call('GET', KEYS[2]) or '0')}
end

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now_ms < tonumber(sale[1]) or now_ms >= tonumber(sale[2]) then
  return {'ended'}
end
local qty = tonumber(ARGV[3])
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if qty > stock then
  return {'sold_out'}
end
local bought = tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0')
if bought + qty > tonumber(sale[3]) then
  return {'limit'}
end

redis.call('SREM', KEYS[4], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], qty)
redis.call('HSET', KEYS[6], ARGV[1], ARGV[4])
return {'taken', redis.call('DECRBY', KEYS[2], qty)}
