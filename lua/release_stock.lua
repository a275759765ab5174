-- release_stock.lua: the original design's stock rollback. Returns an order's
-- units to the sale's stock and to the buyer's allowance, at most once per
-- order: the released set remembers every order already returned, so a retried
-- or racing release (cancel vs. payment timeout, a crash and a repair) cannot
-- count the same units twice.
--
-- Units are given back only by a Redis that took them: one that holds the
-- order's `accepted` record. A master promoted after a failover that lost
-- the order (with WAIT off) never deducted its units, so a cancel reaching
-- it before reconciliation must not add them (the books would end a unit
-- high, and the sale could sell it twice); the order's record is written
-- instead (booked, released), so that reconciliation finds it known and
-- does not take the units off either.
--
-- KEYS[1]  stock          fs:{pid}:stock
-- KEYS[2]  bought hash    fs:{pid}:bought
-- KEYS[3]  released set   fs:{pid}:released  order ids already returned
-- KEYS[4]  accepted hash  fs:{pid}:accepted  order_id -> order record (JSON)
-- KEYS[5]  retaken hash   fs:{pid}:retaken   order_id -> the time of the cancel
--          whose units a late payment took again (retake_order.lua)
-- ARGV[1]  order_id
-- ARGV[2]  user_id
-- ARGV[3]  quantity (integer >= 1)
-- ARGV[4]  the order's record as the books have it (JSON, "booked"), kept
--          when this Redis does not know the order
-- ARGV[5]  the time of the cancel being released (ms: the order's `updated`
--          in the books; each cancel of an order is later than the one before)
--
-- A late payment may take an order's units again after its cancel gave them
-- back (retake_order.lua). A release of that same cancel arriving after it
-- (the sweeper's, finishing the cancel it made, racing the payment) must not
-- give them back a second time: the retaken hash says which cancel the
-- retake followed, and only the release of a later cancel (a refund of the
-- order paid late) gives the units back again.
--
-- Returns {released, stock}: released = 1 when this call returned the units
-- (or found them never taken here), 0 when the order had been released
-- before (nothing changed, but the stock is written again, unchanged, for a
-- WAIT to follow); stock = the units left now.

local retaken = redis.call('HGET', KEYS[5], ARGV[1])
if retaken and tonumber(retaken) >= tonumber(ARGV[5]) then
  -- A release of the cancel the retake followed: given back already.
  local stock = redis.call('GET', KEYS[1])
  if stock then
    redis.call('SET', KEYS[1], stock)
  end
  return {0, tonumber(stock or '0')}
end
if retaken then
  redis.call('HDEL', KEYS[5], ARGV[1])
end

if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then
  local stock = redis.call('GET', KEYS[1])
  -- Written again (unchanged): a write replicated after the first release,
  -- so a WAIT after this script confirms that replicas have that release.
  if stock then
    redis.call('SET', KEYS[1], stock)
  end
  return {0, tonumber(stock or '0')}
end

if redis.call('HSETNX', KEYS[4], ARGV[1], ARGV[4]) == 1 then
  -- This Redis never took these units: nothing to give back.
  return {1, tonumber(redis.call('GET', KEYS[1]) or '0')}
end

local stock = redis.call('INCRBY', KEYS[1], ARGV[3])
local left = redis.call('HINCRBY', KEYS[2], ARGV[2], -tonumber(ARGV[3]))
if left <= 0 then
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return {1, stock}
