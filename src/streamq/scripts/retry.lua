-- retry: move an owned entry to the delayed set as a new attempt, fenced on ownership.
-- A re-sent call (same token) returns the first send's reply.
--
-- KEYS[1]  stream    KEYS[2]  delayed zset    KEYS[3]  jobs hash
-- KEYS[4]  starts hash    KEYS[5]  this call's memo (settled:<token>)
-- ARGV[1]  group     ARGV[2]  consumer        ARGV[3]  entry id
-- ARGV[4]  member: the delayed record's key in the zset and the jobs hash (unique per retry,
--          so two copies of one job id never overwrite each other; the job id is in the fields)
-- ARGV[5]  delay ms    ARGV[6]  memo lifetime ms
-- ARGV[7..]  the new envelope fields, flat (first pair is 'due'; its value is set here from
--            the server clock)
--
-- Returns: 1 moved (acked, deleted, its starts field removed); 0 pending for another consumer
-- (nothing changed); -1 pending for no one (already settled, or deleted; nothing changed).
-- Under maxmemory (noeviction) ZADD/HSET are refused before any XACK/XDEL: the call fails
-- with nothing changed and the entry stays pending for this consumer.
local stream, delayed, jobs, starts, memo = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer, id, member = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local before = redis.call('GET', memo)
if before then return memo_decode(before)[1] end

local s = settle_status(stream, group, consumer, id)
if s == APPLIED then
  local due = now_ms() + tonumber(ARGV[5])
  local fields = {}
  for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
  fields[2] = tostring(due)
  redis.call('ZADD', delayed, due, member)
  redis.call('HSET', jobs, member, cjson.encode(fields))
  redis.call('XACK', stream, group, id)
  redis.call('XDEL', stream, id)
  redis.call('HDEL', starts, id)
end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, memo_encode({s}), 'PX', ARGV[6])
return s
