-- retry: move an owned entry to the delayed set as a new attempt, fenced on ownership.
--
-- KEYS[1]  stream    KEYS[2]  delayed zset    KEYS[3]  jobs hash
-- ARGV[1]  group     ARGV[2]  consumer        ARGV[3]  entry id
-- ARGV[4]  job id    ARGV[5]  delay ms        ARGV[6..]  the new envelope fields, flat
--          (first pair is 'due'; its value is set here from the server clock)
--
-- Returns: 1 when moved, 0 when this consumer no longer owns the entry (nothing changed).
local stream, delayed, jobs = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
if not owned(stream, group, consumer, id) then
  return 0
end
local due = now_ms() + tonumber(ARGV[5])
local fields = {}
for i = 6, #ARGV do fields[#fields + 1] = ARGV[i] end
fields[2] = tostring(due)
redis.call('ZADD', delayed, due, ARGV[4])
redis.call('HSET', jobs, ARGV[4], cjson.encode(fields))
redis.call('XACK', stream, group, id)
redis.call('XDEL', stream, id)
return 1
