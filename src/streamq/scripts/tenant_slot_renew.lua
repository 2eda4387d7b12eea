-- tenant_slot_renew: extend the leases of slots this worker still holds for one tenant.
-- A slot whose lease already expired is not taken again (another job may hold it now).
--
-- KEYS[1]  the tenant's slots zset (holder -> lease expiry ms, Redis clock)
-- ARGV[1]  lease ms    ARGV[2..]  holders
--
-- Returns: the holders whose slot was gone (their lease had expired)
local key, lease = KEYS[1], tonumber(ARGV[1])
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', key, ARGV[i]) then
    redis.call('ZADD', key, now + lease, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
if redis.call('EXISTS', key) == 1 then redis.call('PEXPIRE', key, lease) end
return lost
