-- void_order.lua: takes back an order whose WAIT failed (fewer replicas than
-- asked confirmed it), so that an order answered 503 never reaches the books.
-- Atomic against claim_batch.lua, the workers' side of the same decision:
-- an order is either voided here before a worker claims it, or claimed
-- (after the worker's own WAIT confirmed the replicas have it) and then never
-- voided. A voided order's units and allowance go back, its idempotency
-- record is dropped (a retry with the key is a new order) and its record
-- leaves the accepted hash; its stream entry stays, for a worker to ack
-- without a row.
--
-- KEYS[1]  accepted hash  fs:{pid}:accepted  order_id -> order record (JSON)
-- KEYS[2]  void hash      fs:{pid}:void      order_id -> "void" | "replayed"
-- KEYS[3]  claimed        fs:{pid}:claimed   highest entry id a worker claimed
-- KEYS[4]  stock          fs:{pid}:stock
-- KEYS[5]  bought hash    fs:{pid}:bought
-- KEYS[6]  idem hash      fs:{pid}:idem
-- ARGV[1]  order_id
-- ARGV[2]  idempotency field "user_id:key", or ""
--
-- Returns one of
--   "void"      taken back now (or before)
--   "claimed"   a worker claimed it after its WAIT: the replicas have it
--   "replayed"  a request with the same key has answered since (it stands)
--   "unknown"   this Redis does not have the order

local record = redis.call('HGET', KEYS[1], ARGV[1])
local state = redis.call('HGET', KEYS[2], ARGV[1])
if state == 'void' then
  return 'void'
end
if not record then
  return 'unknown'
end
if state == 'replayed' then
  return 'replayed'
end

local order = cjson.decode(record)
if type(order['entry_id']) ~= 'string' then
  return 'claimed' -- restored from the books: it is persisted
end
local claimed = redis.call('GET', KEYS[3])
if claimed then
  local ems, eseq = string.match(order['entry_id'], '^(%d+)-(%d+)$')
  local cms, cseq = string.match(claimed, '^(%d+)-(%d+)$')
  ems, eseq, cms, cseq = tonumber(ems), tonumber(eseq), tonumber(cms), tonumber(cseq)
  if ems < cms or (ems == cms and eseq <= cseq) then
    return 'claimed'
  end
end

redis.call('HSET', KEYS[2], ARGV[1], 'void')
redis.call('INCRBY', KEYS[4], order['quantity'])
local user = tostring(order['user_id'])
if redis.call('HINCRBY', KEYS[5], user, -order['quantity']) <= 0 then
  redis.call('HDEL', KEYS[5], user)
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[6], ARGV[2]) == ARGV[1] then
  redis.call('HDEL', KEYS[6], ARGV[2])
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 'void'
