-- fail: move an owned entry to the dead-letter stream, fenced on ownership.
-- A re-sent call (same token) returns the first send's reply.
--
-- KEYS[1]  stream    KEYS[2]  dead stream    KEYS[3]  starts hash
-- KEYS[4]  this call's memo (settled:<token>)
-- ARGV[1]  group     ARGV[2]  consumer    ARGV[3]  entry id
-- ARGV[4]  dead-letter cap (approximate MAXLEN; 0 = uncapped)    ARGV[5]  memo lifetime ms
-- ARGV[6..]  dead-letter fields, flat (the envelope plus reason, error, traceback, ...)
--
-- Returns: 1 dead-lettered (acked, deleted, its starts field removed); 0 pending for another
-- consumer (nothing changed); -1 pending for no one (already settled, or deleted).
-- Under maxmemory (noeviction) the dead-letter XADD is refused before any XACK/XDEL: the call
-- fails with nothing changed and the entry stays pending for this consumer.
local stream, dead, starts, memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
local before = redis.call('GET', memo)
if before then return memo_decode(before)[1] end

local s = settle_status(stream, group, consumer, id)
if s == APPLIED then
  local fields = {}
  for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
  fields[#fields + 1] = 'failed_at'
  fields[#fields + 1] = tostring(now_ms())
  local cap = tonumber(ARGV[4])
  if cap > 0 then
    redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', unpack(fields))
  else
    redis.call('XADD', dead, '*', unpack(fields))
  end
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  redis.call('HDEL', starts, id)
end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, memo_encode({s}), 'PX', ARGV[5])
return s
