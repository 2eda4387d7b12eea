-- lease_release: give up a runner's lease at shutdown, so another replica takes it at once.
-- Fenced: a lease that another holder (or a newer token) took is left alone.
--
-- KEYS[1]  lease hash (fields: holder, token)
-- ARGV[1]  holder    ARGV[2]  token
--
-- Returns: 1 released; 0 another holder or token holds the lease; -1 no lease (already
-- released or expired: a re-send finds this)
local lease = KEYS[1]
local holder, token = ARGV[1], ARGV[2]
local cur = redis.call('HMGET', lease, 'holder', 'token')
if not cur[1] then return -1 end
if cur[1] ~= holder or cur[2] ~= token then return 0 end
redis.call('DEL', lease)
return 1
