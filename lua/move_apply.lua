-- move_apply.lua: the taking side of a move between two stock shards of one
-- sale (move_take.lua): its units added to this shard's stock, once per
-- move id however often it is applied (the caller, a buyer's search for
-- units, the reconciler after a crash or a failover).
--
-- KEYS[1]  stock     fs:{pid~k}:stock
-- KEYS[2]  moved_in  fs:{pid~k}:moved_in  move id -> "<from>:<units>"
-- KEYS[3]  sale      fs:{pid~k}:sale      moved_in (units)
-- ARGV[1]  move id
-- ARGV[2]  units (integer >= 1)
-- ARGV[3]  the giving shard's number
--
-- Returns 1 when this call added the units, 0 when the move was applied
-- before, -1 when this shard is not open (nothing written: a sale retired).

if redis.call('EXISTS', KEYS[3]) == 0 then
  return -1
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3] .. ':' .. ARGV[2]) == 0 then
  return 0
end
redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[3], 'moved_in', ARGV[2])
return 1
