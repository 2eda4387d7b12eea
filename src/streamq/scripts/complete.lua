-- complete: acknowledge and delete finished entries, fenced on ownership.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3..]  entry ids
--
-- Returns: the entry ids this consumer no longer owns (another worker reclaimed them);
-- those are left pending for their new owner, untouched.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if owned(stream, group, consumer, id) then
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
  else
    lost[#lost + 1] = id
  end
end
return lost
