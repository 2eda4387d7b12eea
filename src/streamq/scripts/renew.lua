-- renew: extend the locks of the entries this consumer still holds, fenced on ownership.
-- XCLAIM ... JUSTID to itself resets the idle time without raising the delivery count;
-- an entry another worker reclaimed is never claimed back.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3..]  entry ids
--
-- Returns: the entry ids this consumer no longer owns (the caller must stop acking them).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if owned(stream, group, consumer, id) then
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
  else
    lost[#lost + 1] = id
  end
end
return lost
