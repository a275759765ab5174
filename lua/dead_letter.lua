-- dead_letter.lua: moves a stream entry that can never be persisted to the
-- sale's dead-letter stream, then acks it. One script, so the copy and the
-- ack happen together (a crash cannot ack an entry whose copy is missing),
-- and it works on a Redis Cluster, where both keys share the sale's slot.
--
-- KEYS[1]  orders stream  fs:{pid}:orders
-- KEYS[2]  dead letters   fs:{pid}:dead
-- ARGV[1]  consumer group
-- ARGV[2]  id of the entry in the orders stream
-- ARGV[3..] field, value, field, value, ... of the dead letter
--
-- Returns the id of the dead letter.

local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return id
