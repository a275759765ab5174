-- pause_sale.lua: an operator pauses a sale, or resumes it. While paused
-- every order is refused (`sale_paused`, place_order.lua; a keyed retry
-- of an order accepted before still gets its answer), the waiting room's
-- line stands still (room_tick.lua), and admissions that were valid when
-- the pause began do not run out during it (the room gives them the
-- pause's length again: see sale/room/state.rs). The window is not moved:
-- a sale paused past its end has ended.
--
-- KEYS[1]  sale hash  fs:{pid}:sale   paused_ms (while paused: since when),
--                                     last_pause_ms, last_resume_ms (the
--                                     last pause, once resumed)
-- ARGV[1]  "pause" or "resume"
--
-- Returns {"no_sale"}; {"ended"} for a pause asked past the sale's end (a
-- pause would change nothing there; a resume is still taken); or
-- {state, changed, since_ms, now_ms}: state
-- "paused" (since since_ms) or "live" (since_ms: the last resume, or 0);
-- changed 1 when this call paused or resumed it, 0 when it already was.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'no_sale'}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local paused = redis.call('HGET', KEYS[1], 'paused_ms')
if ARGV[1] == 'pause' then
  local end_ms = tonumber(redis.call('HGET', KEYS[1], 'end_ms') or '0')
  if not paused and end_ms > 0 and now_ms >= end_ms then
    return {'ended'}
  end
  if paused then
    return {'paused', 0, tonumber(paused), now_ms}
  end
  redis.call('HSET', KEYS[1], 'paused_ms', now_ms)
  return {'paused', 1, now_ms, now_ms}
end
if not paused then
  return {'live', 0, tonumber(redis.call('HGET', KEYS[1], 'last_resume_ms') or '0'), now_ms}
end
redis.call('HSET', KEYS[1], 'last_pause_ms', paused, 'last_resume_ms', now_ms)
redis.call('HDEL', KEYS[1], 'paused_ms')
return {'live', 1, now_ms, now_ms}
