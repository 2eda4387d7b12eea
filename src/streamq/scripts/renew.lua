-- renew: extend the locks of the entries this consumer still holds, fenced on ownership.
-- XCLAIM ... JUSTID to itself resets the idle time without raising the delivery count;
-- an entry another worker reclaimed is never claimed back.
-- An owned entry whose body was deleted while pending is not XCLAIMed: Redis 7 would drop it
-- from the PEL without a trace. It stays pending (its worker may still complete it); if the
-- worker dies, the reclaimer records it as a lost payload.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3..]  entry ids
--
-- Returns: the entry ids this consumer no longer owns, pending for another consumer or for no
-- one (the caller must stop acking them).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if owner(stream, group, id) == consumer then
    if #redis.call('XRANGE', stream, id, id) > 0 then
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
