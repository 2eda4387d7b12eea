-- reclaim: take over entries idle longer than the lock (their worker stalled or died).
-- One XAUTOCLAIM page per call; the caller loops until the cursor is 0-0.
-- XAUTOCLAIM (not JUSTID) raises the delivery count: an entry delivered more than
-- max_stalled_count + 1 times is dead-lettered as stalled instead of running again.
-- Entries whose body was deleted (Redis 7: XAUTOCLAIM's third element; Redis 6.2: a nil
-- entry) are lost payloads: each is recorded in the dead stream, never ignored.
--
-- KEYS[1]  stream    KEYS[2]  dead stream
-- ARGV[1]  group     ARGV[2]  consumer (the reclaimer)    ARGV[3]  min idle ms
-- ARGV[4]  start cursor    ARGV[5]  page size    ARGV[6]  max stalled count
-- ARGV[7]  dead-letter cap (approximate MAXLEN; 0 = uncapped)
--
-- Returns: {next cursor, {id, fields, delivery count, ...} to run, {stalled ids}, {lost ids}}
local stream, dead = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local max_deliveries = tonumber(ARGV[6]) + 1
local cap = tonumber(ARGV[7])
local function bury(fields)
  fields[#fields + 1] = 'failed_at'
  fields[#fields + 1] = tostring(now_ms())
  if cap > 0 then
    redis.call('XADD', dead, 'MAXLEN', '~', cap, '*', unpack(fields))
  else
    redis.call('XADD', dead, '*', unpack(fields))
  end
end
local r = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local run, stalled, lost = {}, {}, {}
local function lose(id)
  bury({'reason', 'lost_payload', 'entry', id, 'error', 'entry deleted while pending'})
  lost[#lost + 1] = id
end
for _, e in ipairs(r[2]) do
  if type(e) ~= 'table' or type(e[2]) ~= 'table' then
    -- Redis 6.2 returns a nil body for a deleted entry and keeps it pending.
    local id = type(e) == 'table' and e[1] or nil
    if id then
      redis.call('XACK', stream, group, id)
      lose(id)
    end
  else
    local id, fields = e[1], e[2]
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    local deliveries = tonumber(p[1][4])
    if deliveries > max_deliveries then
      local dl = {}
      for i = 1, #fields do dl[i] = fields[i] end
      dl[#dl + 1] = 'reason'; dl[#dl + 1] = 'stalled'
      dl[#dl + 1] = 'error'
      dl[#dl + 1] = 'job stalled ' .. tostring(deliveries - 1) .. ' time(s)'
      dl[#dl + 1] = 'entry'; dl[#dl + 1] = id
      bury(dl)
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      stalled[#stalled + 1] = id
    else
      run[#run + 1] = id
      run[#run + 1] = fields
      run[#run + 1] = deliveries
    end
  end
end
if r[3] then
  for _, id in ipairs(r[3]) do lose(id) end
end
return {r[1], run, stalled, lost}
