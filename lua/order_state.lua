-- order_state.lua: what Redis knows of one order's progress, for answering a
-- lookup while MySQL (which knows more: paid, cancelled) is unavailable.
-- Read-only.
--
-- KEYS[1]  accepted hash  fs:{pid}:accepted  order_id -> order record (JSON)
-- KEYS[2]  released set   fs:{pid}:released
-- KEYS[3]  cancels hash   fs:{pid}:cancels
-- KEYS[4]  orders stream  fs:{pid}:orders
-- KEYS[5]  dead letters   fs:{pid}:dead
-- ARGV[1]  order_id
-- ARGV[2]  consumer group
--
-- Returns {} for an order Redis does not know, else {record, state} with
-- state one of
--   "released"          its units were given back: it was cancelled
--   "cancel_requested"  a cancel waits for it to be persisted
--   "in_stream"         in the stream, not yet persisted (undelivered, or
--                       delivered and not acked)
--   "dead"              moved to dead letters: never persisted
--   "persisted"         acked by a worker, so in MySQL (confirmed or later)

local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return {}
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then
  return {record, 'released'}
end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return {record, 'cancel_requested'}
end

local decoded = cjson.decode(record)
if decoded['booked'] then
  return {record, 'persisted'} -- restored from the books (restore_booked.lua)
end
local entry = decoded['entry_id']
if type(entry) ~= 'string' then
  return {record, 'in_stream'}
end

-- Stream ids compare as (ms, seq) pairs.
local function after(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams > bms or (ams == bms and aseq > bseq)
end

if redis.call('EXISTS', KEYS[4]) == 0 then
  return {record, 'in_stream'}
end
local delivered_up_to = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[4])) do
  local fields = {}
  for i = 1, #group, 2 do
    fields[group[i]] = group[i + 1]
  end
  if fields['name'] == ARGV[2] then
    delivered_up_to = fields['last-delivered-id']
  end
end
if delivered_up_to == nil or after(entry, delivered_up_to) then
  return {record, 'in_stream'}
end
if #redis.call('XPENDING', KEYS[4], ARGV[2], entry, entry, 1) > 0 then
  return {record, 'in_stream'}
end

-- Acked: persisted, unless it was acked by moving it to dead letters (few,
-- by design; the newest thousand are looked at).
for _, letter in ipairs(redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1000)) do
  local fields = letter[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'dead_source_id' and fields[i + 1] == entry then
      return {record, 'dead'}
    end
  end
end
return {record, 'persisted'}
