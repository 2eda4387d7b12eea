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
local run, stalled, lost = {}, {}, {}
local function lose(id)
  bury({'reason', 'lost_payload', 'entry', id, 'error', 'entry deleted while pending'})
  lost[#lost + 1] = id
end
-- Redis 6.2 answers a deleted entry with a bare nil (no id) and keeps it pending, now owned by
-- the reclaimer. The claimed entries are, in order, the reclaimer's pending entries from the
-- start cursor up to (not including) the next cursor; each nil is the next one of those whose
-- body is gone. Only called when a nil came back, so Redis 7 never pays for it.
local function nil_ids(entries, start, cursor)
  local hi = '+'
  if cursor ~= '0-0' then hi = '(' .. cursor end
  local lo, page, at = start, {}, 1
  local function next_pending()
    if at > #page then
      page = redis.call('XPENDING', stream, group, lo, hi, 100, consumer)
      if #page == 0 then return nil end
      at, lo = 1, '(' .. page[#page][1]
    end
    at = at + 1
    return page[at - 1][1]
  end
  local ids = {}
  for _, e in ipairs(entries) do
    local id = next_pending()
    if type(e) == 'table' then
      while id and id ~= e[1] do id = next_pending() end
    else
      while id and #redis.call('XRANGE', stream, id, id) > 0 do id = next_pending() end
      if id then ids[#ids + 1] = id end
    end
  end
  return ids
end

local r = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[3], ARGV[4], 'COUNT', ARGV[5])
-- Resolve 6.2's nil entries first, while every claimed entry is still pending.
for _, e in ipairs(r[2]) do
  if type(e) ~= 'table' then
    for _, id in ipairs(nil_ids(r[2], ARGV[4], r[1])) do
      redis.call('XACK', stream, group, id)
      lose(id)
    end
    break
  end
end
for _, e in ipairs(r[2]) do
  if type(e) == 'table' then
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
-- Redis 7 drops deleted entries from the PEL itself and names them in a third element.
if r[3] then
  for _, id in ipairs(r[3]) do lose(id) end
end
return {r[1], run, stalled, lost}
