-- release: hand unfinished entries back at shutdown, fenced on ownership.
-- Each owned entry is re-added at the tail with the same fields (attempt unchanged), then
-- acknowledged and deleted, so another worker takes it at once instead of after lock expiry.
-- An owned entry whose body was deleted while pending (a trim) is left pending: the reclaimer
-- records it as a lost payload; acking it here would drop it without a trace.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3..]  entry ids
--
-- Returns: the entry ids this consumer no longer owns (left to their new owner).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  if owned(stream, group, consumer, id) then
    local e = redis.call('XRANGE', stream, id, id)
    if #e > 0 then
      local fields = e[1][2]
      if fields[1] == 'due' and fields[2] == '' then
        fields[2] = id_ms(id)
      end
      redis.call('XADD', stream, '*', unpack(fields))
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
