-- drain_sleep.lua: a stream worker's drain found nothing to do and asks to
-- sleep until the sale's next order rings its bell. Atomically: when the
-- consumer group has nothing pending (for any consumer) and nothing
-- undelivered, it removes the sale's `awake` mark, so that the next order
-- (place_order.lua) sees it missing, sets it again and PUBLISHes the sale's
-- id on the deployment's bell channel. Otherwise the drain stays awake.
-- So no entry can arrive unseen: one added before this script is found by
-- it (the drain stays awake), one added after finds the mark missing (a
-- bell rings). Every key is the sale's (one hash slot).
--
-- KEYS[1]  sale hash      fs:{pid}:sale    (field `awake`)
-- KEYS[2]  orders stream  fs:{pid}:orders
-- ARGV[1]  the workers' consumer group
--
-- Returns 1 (asleep: the mark is gone) or 0 (something waits: stay awake).

local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[2])
if not ok then
  return 0 -- no stream (yet): nothing to sleep on
end
local delivered
for _, g in ipairs(groups) do
  local fields = {}
  for i = 1, #g, 2 do
    fields[g[i]] = g[i + 1]
  end
  if fields['name'] == ARGV[1] then
    delivered = fields['last-delivered-id']
  end
end
if not delivered then
  return 0 -- no group (yet)
end
local pending = redis.call('XPENDING', KEYS[2], ARGV[1])
if pending[1] > 0 then
  return 0
end
if #redis.call('XRANGE', KEYS[2], '(' .. delivered, '+', 'COUNT', 1) > 0 then
  return 0
end
redis.call('HDEL', KEYS[1], 'awake')
return 1
