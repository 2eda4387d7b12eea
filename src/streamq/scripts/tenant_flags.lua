-- tenant_flags: the tenants of a queue flagged now, read on the Redis clock (read only).
--
-- KEYS[1]  flags zset (tenant -> expiry ms)
-- KEYS[2]  reasons hash (tenant -> JSON reason)
-- ARGV[1]  1 to return the reasons too, 0 for tenants and expiries only (producers)
--
-- Returns: {server now ms, {tenant, expiry ms, ...}, {reason JSON or false, ...}}
local now = now_ms()
local live = redis.call('ZRANGE', KEYS[1], '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
local why = {}
if ARGV[1] == '1' and #live > 0 then
  local names = {}
  for i = 1, #live, 2 do names[#names + 1] = live[i] end
  why = redis.call('HMGET', KEYS[2], unpack(names))
end
return {now, live, why}
