-- limiter: a global rate limit per queue, a fixed window aligned on the server clock.
--
-- KEYS[1]  limiter hash (fields: w = window start ms, c = tokens granted in it)
-- ARGV[1]  max jobs per window    ARGV[2]  window length ms
-- ARGV[3]  tokens wanted (> 0), or tokens to give back (< 0)
-- ARGV[4]  with a refund: the window start the tokens came from (ignored otherwise)
--
-- Returns: {tokens granted (0 for a refund), window start ms, ms until the window ends}
local key = KEYS[1]
local max, len, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local start = now - (now % len)
local w = tonumber(redis.call('HGET', key, 'w') or '-1')
if w ~= start then
  redis.call('HSET', key, 'w', start, 'c', 0)
  redis.call('PEXPIRE', key, len * 2)
end
local used = tonumber(redis.call('HGET', key, 'c'))
local granted = 0
if want > 0 then
  granted = math.min(want, math.max(0, max - used))
  if granted > 0 then redis.call('HINCRBY', key, 'c', granted) end
elseif want < 0 and tonumber(ARGV[4]) == start then
  redis.call('HSET', key, 'c', math.max(0, used + want))
end
return {granted, start, start + len - now}
