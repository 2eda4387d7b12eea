-- complete: acknowledge and delete finished entries, fenced on ownership.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer    ARGV[3..]  entry ids
--
-- Returns: the entry ids this consumer no longer owns (another worker reclaimed them);
-- those are left pending for their new owner, untouched.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local lost, done = {}, {}
local function flush()
  -- One XACK and one XDEL for many ids: each redis.call costs more than the work it does.
  redis.call('XACK', stream, group, unpack(done))
  redis.call('XDEL', stream, unpack(done))
  done = {}
end
for i = 3, #ARGV do
  local id = ARGV[i]
  if owned(stream, group, consumer, id) then
    done[#done + 1] = id
    if #done == 500 then flush() end
  else
    lost[#lost + 1] = id
  end
end
if #done > 0 then flush() end
return lost
