-- claim_batch.lua: a worker's claim on a batch it is about to persist, run
-- after its WAIT confirmed that the replicas hold the batch. Raises the
-- claimed mark to the batch's highest entry id (from then on no order up to
-- it can be voided: see void_order.lua) and returns the batch's orders that
-- were voided before (to be acked without a row).
--
-- KEYS[1]  void hash  fs:{pid}:void     order_id -> "void" | "replayed"
-- KEYS[2]  claimed    fs:{pid}:claimed  highest entry id a worker claimed
-- ARGV[1]  the batch's highest entry id
-- ARGV[2..] the batch's order ids

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end

local claimed = redis.call('GET', KEYS[2])
local bms, bseq = parse(ARGV[1])
local raise = not claimed
if claimed then
  local cms, cseq = parse(claimed)
  raise = bms > cms or (bms == cms and bseq > cseq)
end
if raise then
  redis.call('SET', KEYS[2], ARGV[1])
end

local voided = {}
if redis.call('EXISTS', KEYS[1]) == 1 then
  for i = 2, #ARGV do
    if redis.call('HGET', KEYS[1], ARGV[i]) == 'void' then
      voided[#voided + 1] = ARGV[i]
    end
  end
end
return voided
