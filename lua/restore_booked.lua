-- restore_booked.lua: brings a sale's Redis state back in line with orders
-- the books (MySQL) hold, after Redis lost writes: a failover to a replica
-- that had not received them, a restart that lost its last writes, or a
-- total loss (`flashsale recover`). Idempotent, and atomic per call, so it
-- runs while the sale takes orders: an order Redis already knows is left
-- as it is.
--
-- KEYS[1]  accepted hash  fs:{pid}:accepted  order_id -> order record (JSON)
-- KEYS[2]  stock          fs:{pid}:stock
-- KEYS[3]  bought hash    fs:{pid}:bought    user_id -> units accepted
-- KEYS[4]  released set   fs:{pid}:released
-- KEYS[5]  idem hash      fs:{pid}:idem      "user_id:key" -> order_id
-- KEYS[6]  repaired hash  fs:{pid}:repaired  what reconciliation restored
-- KEYS[7]  retaken hash   fs:{pid}:retaken   orders a late payment took again
-- ARGV[1]  "1" to count what is restored in the repaired hash (a repair),
--          "0" not to (a recovery from scratch)
-- ARGV[2..] six per order: order_id, user_id, quantity, state, record
--          (JSON), idempotency field ("user_id:key" or ""); state is
--          "sold" (confirmed or paid), "cancelled" (units not yet given
--          back to Redis) or "returned" (cancelled, units given back)
--
-- For an order Redis does not know: its record and idempotency record come
-- back, and a sold order's units are taken off the stock and added to the
-- buyer's count again (a cancelled one's units were never taken here, and
-- a release never gives back units of an order this Redis did not hold:
-- see release_stock.lua; so it only joins the released set, for no release
-- to add them). For a known order whose units the books say were given back but
-- Redis never got back (a lost release): the release is done again,
-- unless a late payment took the units again since (retake_order.lua: the
-- books say `returned` until the payment is recorded, a moment later).
--
-- Returns {orders restored, units taken off the stock, releases redone,
-- idempotency records restored, stock now}.

local restored, units, releases, idem = 0, 0, 0, 0
for i = 2, #ARGV, 6 do
  local id, user, qty, state, record, field =
    ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if redis.call('HSETNX', KEYS[1], id, record) == 1 then
    restored = restored + 1
    if state == 'sold' then
      redis.call('DECRBY', KEYS[2], qty)
      redis.call('HINCRBY', KEYS[3], user, qty)
      units = units + qty
    else
      redis.call('SADD', KEYS[4], id)
    end
    if field ~= '' and redis.call('HSETNX', KEYS[5], field, id) == 1 then
      idem = idem + 1
    end
  elseif state == 'returned' and redis.call('HEXISTS', KEYS[7], id) == 0
      and redis.call('SADD', KEYS[4], id) == 1 then
    redis.call('INCRBY', KEYS[2], qty)
    if redis.call('HINCRBY', KEYS[3], user, -qty) <= 0 then
      redis.call('HDEL', KEYS[3], user)
    end
    releases = releases + 1
  end
end

if ARGV[1] == '1' and restored + releases > 0 then
  local t = redis.call('TIME')
  redis.call('HINCRBY', KEYS[6], 'orders', restored)
  redis.call('HINCRBY', KEYS[6], 'units', units)
  redis.call('HINCRBY', KEYS[6], 'releases', releases)
  redis.call('HINCRBY', KEYS[6], 'idempotency_records', idem)
  redis.call('HSET', KEYS[6], 'last_ms', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
return {restored, units, releases, idem, tonumber(redis.call('GET', KEYS[2]) or '0')}
