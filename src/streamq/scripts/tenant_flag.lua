-- tenant_flag: flag a tenant of a queue for a while (its producers route it to the
-- secondary lane), or lift the flag. A flag only ever lengthens: flagging a tenant that is
-- already flagged for longer keeps the later expiry. Expired flags are pruned on the way, and
-- both keys expire with the last flag, so an idle queue keeps nothing.
--
-- KEYS[1]  flags zset (tenant -> expiry ms, Redis clock)
-- KEYS[2]  reasons hash (tenant -> JSON {"reason": ..., "since_ms": ...})
-- ARGV[1]  tenant    ARGV[2]  duration ms (> 0 to flag, 0 to lift the flag)
-- ARGV[3]  the reason's JSON, with "since_ms" left for the script to fill (flag only)
--
-- Returns: {expiry ms of the tenant's flag now (0: not flagged), server now ms,
--           1 when the tenant was flagged before this call, else 0}
local flags, reasons = KEYS[1], KEYS[2]
local tenant, ms = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local gone = redis.call('ZRANGEBYSCORE', flags, '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', flags, '-inf', now)
  redis.call('HDEL', reasons, unpack(gone))
end
local cur = tonumber(redis.call('ZSCORE', flags, tenant) or '0')
local was = 0
if cur > now then was = 1 end
local expiry = 0
if ms > 0 then
  expiry = math.max(cur, now + ms)
  redis.call('ZADD', flags, expiry, tenant)
  local since = now
  if was == 1 then
    local old = redis.call('HGET', reasons, tenant)
    if old then
      local ok, decoded = pcall(cjson.decode, old)
      if ok and decoded.since_ms then since = decoded.since_ms end
    end
  end
  local info = cjson.decode(ARGV[3])
  info.since_ms = since
  redis.call('HSET', reasons, tenant, cjson.encode(info))
else
  redis.call('ZREM', flags, tenant)
  redis.call('HDEL', reasons, tenant)
end
local last = redis.call('ZRANGE', flags, -1, -1, 'WITHSCORES')
if #last > 0 then
  local ttl = math.max(1, tonumber(last[2]) - now)
  redis.call('PEXPIRE', flags, ttl)
  redis.call('PEXPIRE', reasons, ttl)
else
  redis.call('DEL', flags, reasons)
end
return {expiry, now, was}
