-- reclaim: take over entries idle longer than the lock (their worker stalled or died), at
-- most as many as the caller will start at once. One XAUTOCLAIM page per call; the caller
-- loops while it has free slots and the cursor is not 0-0.
--
-- The stall budget counts runs that started and never settled, kept in the starts hash
-- (entry id -> starts so far; absent = 1, the first delivery's run), not XPENDING's delivery
-- counter, so an entry that was claimed but never started does not spend it. Every settle
-- removes the field. For each claimed entry, s = starts so far: the entry has stalled s times.
-- s > max stalled count: dead-lettered as stalled (acked, deleted, field removed). Otherwise
-- the field becomes s + 1 and the entry is returned with starts = s + 1: the caller starts
-- every returned entry at once (a claim is a start, that is what makes the count right).
-- Known bounds: entries a worker fetched but had not started yet (its prefetch buffer) are
-- charged one start if that worker dies; under maxmemory (noeviction) the HSET may be refused:
-- the entry is still returned and runs, its start just goes unrecorded.
--
-- Entries whose body was deleted (Redis 7: XAUTOCLAIM's third element; Redis 6.2: a nil
-- entry) are lost payloads: each is recorded in the dead stream, never ignored.
-- XAUTOCLAIM itself is never refused under maxmemory; a refused dead letter (stalled, or a
-- 6.2 lost payload) leaves its entry pending for this reclaimer, to be tried again later.
--
-- A tracked job (a 'ctl' field) dead-lettered as stalled leaves the tracked hash here; its
-- final record key cannot be named in advance, so the caller writes it (track_final) from
-- the fifth element of the reply.
--
-- KEYS[1]  stream    KEYS[2]  dead stream    KEYS[3]  starts hash    KEYS[4]  tracked hash
-- ARGV[1]  group     ARGV[2]  consumer (the reclaimer)    ARGV[3]  min idle ms
-- ARGV[4]  start cursor    ARGV[5]  count: the most entries to claim (the caller's free slots)
-- ARGV[6]  max stalled count    ARGV[7]  dead-letter cap (approximate MAXLEN; 0 = uncapped)
--
-- Returns: {next cursor, {id, fields, starts, ...} to start now, {stalled ids}, {lost ids},
--   {job id, keep ms, job name, attempt, error, ...} of the stalled ids that were tracked}
local stream, dead, starts, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer = ARGV[1], ARGV[2]
local max_stalled = tonumber(ARGV[6])
local cap = tonumber(ARGV[7])

-- Append a dead letter; false when Redis refused it (out of memory). pcall: earlier entries
-- of this page may already be acked, and a script's writes are not rolled back on error.
local function bury(fields)
  fields[#fields + 1] = 'failed_at'
  fields[#fields + 1] = tostring(now_ms())
  if cap > 0 then
    return (pcall(redis.call, 'XADD', dead, 'MAXLEN', '~', cap, '*', unpack(fields)))
  end
  return (pcall(redis.call, 'XADD', dead, '*', unpack(fields)))
end
local run, stalled, lost, finals = {}, {}, {}, {}
local function lose(id)
  return bury({'reason', 'lost_payload', 'entry', id, 'error', 'entry deleted while pending'})
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
      if lose(id) then
        redis.call('XACK', stream, group, id)
        redis.call('HDEL', starts, id)
        lost[#lost + 1] = id
      end
    end
    break
  end
end
for _, e in ipairs(r[2]) do
  if type(e) == 'table' then
    local id, fields = e[1], e[2]
    local s = tonumber(redis.call('HGET', starts, id) or 1)
    if s > max_stalled then
      local dl = {}
      for i = 1, #fields do dl[i] = fields[i] end
      dl[#dl + 1] = 'reason'; dl[#dl + 1] = 'stalled'
      dl[#dl + 1] = 'error'
      dl[#dl + 1] = 'job stalled ' .. tostring(s) .. ' time(s)'
      dl[#dl + 1] = 'entry'; dl[#dl + 1] = id
      if bury(dl) then
        redis.call('XACK', stream, group, id)
        redis.call('XDEL', stream, id)
        redis.call('HDEL', starts, id)
        stalled[#stalled + 1] = id
        if ctl_of(fields) then
          local cur = redis.call('HGET', tracked, fields[4])
          local rec = cur and cjson.decode(cur)
          if rec and rec.e == id then
            redis.call('HDEL', tracked, fields[4])
            finals[#finals + 1] = fields[4]
            finals[#finals + 1] = rec.k or 0
            finals[#finals + 1] = fields[6]
            finals[#finals + 1] = fields[10]
            finals[#finals + 1] = 'job stalled ' .. tostring(s) .. ' time(s)'
          end
        end
      end
    else
      pcall(redis.call, 'HSET', starts, id, s + 1)
      run[#run + 1] = id
      run[#run + 1] = fields
      run[#run + 1] = s + 1
    end
  end
end
-- Redis 7 drops deleted entries from the PEL itself and names them in a third element: this
-- is the only chance to record them, so they are reported even if the dead letter is refused.
if r[3] then
  for _, id in ipairs(r[3]) do
    lose(id)
    redis.call('HDEL', starts, id)
    lost[#lost + 1] = id
  end
end
return {r[1], run, stalled, lost, finals}
