-- tenant_slot_acquire: take one of a tenant's running slots (the per-tenant concurrency cap),
-- as a lease that expires unless renewed, so a killed worker's slots free themselves.
-- Expired leases are dropped first. A holder that already has a slot keeps it (its lease is
-- extended): a re-send after a lost reply takes no second slot.
--
-- KEYS[1]  the tenant's slots zset (holder -> lease expiry ms, Redis clock)
-- ARGV[1]  the cap (slots per tenant)    ARGV[2]  lease ms    ARGV[3]  holder
--
-- Returns: {1 granted or 0 refused, slots taken now, ms until the next lease expires
--           (when refused; else 0)}
local key = KEYS[1]
local cap, lease, holder = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local n = redis.call('ZCARD', key)
if not redis.call('ZSCORE', key, holder) then
  if n >= cap then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    return {0, n, math.max(1, tonumber(first[2]) - now)}
  end
  n = n + 1
end
redis.call('ZADD', key, now + lease, holder)
redis.call('PEXPIRE', key, lease)
return {1, n, 0}
