-- fail: move an owned entry to the dead-letter stream, fenced on ownership.
--
-- KEYS[1]  stream    KEYS[2]  dead stream
-- ARGV[1]  group     ARGV[2]  consumer    ARGV[3]  entry id
-- ARGV[4]  dead-letter cap (approximate MAXLEN; 0 = uncapped)
-- ARGV[5..]  dead-letter fields, flat (the envelope plus reason, error, traceback, ...)
--
-- Returns: 1 when dead-lettered, 0 when this consumer no longer owns the entry.
local stream, dead = KEYS[1], KEYS[2]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
if not owned(stream, group, consumer, id) then
  return 0
end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
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
return 1
