-- note_payment.lua: keeps a payment notification the books recorded beside
-- the sale's orders (the payments hash), for a failover of the books that
-- loses its record (books::put_back). Only while the sale is in Redis: a
-- retired sale's keys are gone, and a payment for it must not bring one
-- back (nothing would ever remove it).
--
-- KEYS[1]  sale hash      fs:{pid}:sale
-- KEYS[2]  payments hash  fs:{pid}:payments  "<kind>:<payment_id>" -> JSON
-- ARGV[1]  the field ("<kind>:<payment_id>")
-- ARGV[2]  the notification (JSON)
--
-- Returns 1 when kept, 0 when the sale is not in Redis.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
