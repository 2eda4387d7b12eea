-- lease_fenced_set: a singleton runner's write, applied only while its token holds the lease.
-- A holder that lost the lease (another replica took over with a newer token, or it expired)
-- is refused, however late its write arrives. A re-send writes the same value again.
--
-- KEYS[1]  lease hash (fields: holder, token)
-- KEYS[2]  the key to write (on a cluster: in the runner's slot)
-- ARGV[1]  the writer's token    ARGV[2]  value    ARGV[3]  time to live ms (0: none)
--
-- Returns: 1 written; 0 refused (a newer token holds the lease); -1 refused (no lease)
local lease, target = KEYS[1], KEYS[2]
local token, value, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cur = redis.call('HGET', lease, 'token')
if not cur then return -1 end
if cur ~= token then return 0 end
if ttl > 0 then
  redis.call('SET', target, value, 'PX', ttl)
else
  redis.call('SET', target, value)
end
return 1
