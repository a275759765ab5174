-- restock.lua: an operator adds units to an open sale, or takes some away
-- (never more than are left: what is sold stays sold), atomically with
-- the orders: the stock and the sale's `initial` move together, so every
-- equation that counts from `initial` (the audit's, the room's units
-- sold) holds at every moment. Once per restock id: a retry of the same
-- restock (the admin's Idempotency-Key) changes nothing and answers
-- again, so the books' half can be finished by retrying.
--
-- Put back (ARGV[3] "again"): a restock the books hold and this Redis lost
-- (a failover to a replica that had not received it), done again by the
-- reconciler: past the end too, and whatever is left (units taken away
-- that were sold meanwhile leave the stock below 0: oversold, and said
-- so), counted in the sale's `repaired` hash.
--
-- KEYS[1]  sale hash      fs:{pid}:sale      end_ms, initial
-- KEYS[2]  stock          fs:{pid}:stock
-- KEYS[3]  restocks hash  fs:{pid}:restocks  restock id -> units
-- KEYS[4]  repaired hash  fs:{pid}:repaired  restocks, restock_units, last_ms (put back)
-- ARGV[1]  units (a signed integer, not 0)
-- ARGV[2]  the restock's id
-- ARGV[3]  "again" to put back a restock the books hold, else ""
--
-- Returns {"no_sale"}, {"ended"}, {"too_few", stock} (taking away more
-- than are left), or {"done", stock, initial, applied}: applied 1 when
-- this call moved the stock, 0 when this restock was done before.
local sale = redis.call('HMGET', KEYS[1], 'end_ms', 'initial')
if not sale[1] then
  return {'no_sale'}
end
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then
  return {'done', stock, tonumber(sale[2] or '0'), 0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local again = ARGV[3] == 'again'
if now_ms >= tonumber(sale[1]) and not again then
  return {'ended'}
end
local units = tonumber(ARGV[1])
if units < 0 and -units > stock and not again then
  return {'too_few', stock}
end
stock = redis.call('INCRBY', KEYS[2], units)
local initial = redis.call('HINCRBY', KEYS[1], 'initial', units)
redis.call('HSET', KEYS[3], ARGV[2], units)
if again then
  redis.call('HINCRBY', KEYS[4], 'restocks', 1)
  redis.call('HINCRBY', KEYS[4], 'restock_units', units)
  redis.call('HSET', KEYS[4], 'last_ms', now_ms)
end
return {'done', stock, initial, 1}
