-- drop_consumer: remove a consumer from the group only if it has nothing pending.
-- XGROUP DELCONSUMER on a consumer with pending entries would make them undeliverable,
-- so the check and the delete happen in one atomic step.
--
-- KEYS[1]  stream
-- ARGV[1]  group    ARGV[2]  consumer
--
-- Returns: 1 when removed (or absent), 0 when it still has pending entries (kept).
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return 1 end
for _, c in ipairs(consumers) do
  local name, pending
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] end
    if c[i] == 'pending' then pending = c[i + 1] end
  end
  if name == consumer then
    if tonumber(pending) > 0 then return 0 end
    redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer)
    return 1
  end
end
return 1
