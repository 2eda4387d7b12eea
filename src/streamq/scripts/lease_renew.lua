-- lease_renew: extend a runner's lease, fenced on its holder and token.
-- A lease that expired is never renewed (another replica may have taken it and let it go
-- in between): the holder must acquire again, with a new token. A re-send is harmless.
--
-- KEYS[1]  lease hash (fields: holder, token)
-- ARGV[1]  holder    ARGV[2]  token    ARGV[3]  lease duration ms
--
-- Returns: 1 renewed; 0 another holder or token holds the lease; -1 no lease (it expired)
local lease = KEYS[1]
local holder, token, ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local cur = redis.call('HMGET', lease, 'holder', 'token')
if not cur[1] then return -1 end
if cur[1] ~= holder or cur[2] ~= token then return 0 end
redis.call('PEXPIRE', lease, ms)
return 1
