-- move_take.lua: the giving side of a move of units between two stock
-- shards of one sale (sale/shards.rs). A move cannot be one script (the
-- shards are in different hash slots), so it is recorded where the units leave and
-- applied once where they arrive (move_apply.lua); its in-flight record is
-- dropped once the taker has it (HDEL by the caller), its log entry stays
-- for the reconciler to check both sides after a failover of either.
--
-- KEYS[1]  stock   fs:{pid~k}:stock
-- KEYS[2]  moves   fs:{pid~k}:moves   move id -> "<to>:<units>", in flight
-- KEYS[3]  sale    fs:{pid~k}:sale    moved_out (units), moves_out (count)
-- KEYS[4]  gave    fs:{pid~k}:gave    move id -> "<to>:<units>", every move given
-- ARGV[1]  move id (fresh, made by the caller)
-- ARGV[2]  the taking shard's number
-- ARGV[3]  units wanted (integer >= 1)
-- ARGV[4]  units to leave here at least (integer >= 0)
-- ARGV[5]  "redo": the reconciler takes again, exactly ARGV[3] units
--          whatever the stock, a move the taker has and this shard lost in
--          a failover (its units were sold here again: the stock shows it)
--
-- Returns the units taken (0: none to give, or the move was taken before;
-- nothing written).

if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then
  return 0
end
local units
if ARGV[5] == 'redo' then
  units = tonumber(ARGV[3])
else
  local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
  units = math.min(tonumber(ARGV[3]), stock - tonumber(ARGV[4]))
  if units <= 0 then
    return 0
  end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2] .. ':' .. units)
end
redis.call('DECRBY', KEYS[1], units)
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2] .. ':' .. units)
redis.call('HINCRBY', KEYS[3], 'moved_out', units)
redis.call('HINCRBY', KEYS[3], 'moves_out', 1)
return units
