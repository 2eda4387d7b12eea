-- lease_acquire: take a runner's lease when it is free, with a new fencing token.
-- The token comes from a counter that never expires (INCR), so every acquisition gets a
-- token greater than every one before it. A holder that asks while it holds the lease (its
-- first reply was lost) keeps its token and its lease is extended, so a re-send is harmless;
-- unless it names that token as spent (a run with it was cancelled): then it gets a new one,
-- so a cancelled run's late writes stay refused.
--
-- KEYS[1]  lease hash (fields: holder, token; expires with the lease)
-- KEYS[2]  fencing counter (the last token given)
-- ARGV[1]  holder (a consumer name)    ARGV[2]  lease duration ms
-- ARGV[3]  the holder's spent token (0: none)
--
-- Returns: {1 when ARGV[1] holds the lease now, else 0; the holder's token; the holder;
--           ms until the lease expires}
local lease, fence = KEYS[1], KEYS[2]
local holder, ms, spent = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local cur = redis.call('HMGET', lease, 'holder', 'token')
if cur[1] and cur[1] ~= holder then
  return {0, tonumber(cur[2]), cur[1], redis.call('PTTL', lease)}
end
local token = cur[2]
if not cur[1] or token == spent then
  token = redis.call('INCR', fence)
  redis.call('HSET', lease, 'holder', holder, 'token', token)
end
redis.call('PEXPIRE', lease, ms)
return {1, tonumber(token), holder, ms}
