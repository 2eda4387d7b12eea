-- release: hand unfinished entries back at shutdown, fenced on ownership.
-- Each owned entry is re-added at the tail with the same fields (attempt unchanged), then
-- acknowledged and deleted, so another worker takes it at once instead of after lock expiry.
-- An owned entry whose body was deleted while pending (a trim) is left pending: the reclaimer
-- records it as a lost payload; acking it here would drop it without a trace.
-- A re-sent call (same token) returns the first send's reply.
--
-- A tracked job (a 'ctl' field) whose location record names the old entry is re-pointed at
-- the new one, as waiting again (its consumer, start and progress are dropped).
--
-- KEYS[1]  stream    KEYS[2]  starts hash    KEYS[3]  this call's memo (settled:<token>)
-- KEYS[4]  tracked hash
-- ARGV[1]  group     ARGV[2]  consumer       ARGV[3]  memo lifetime ms
-- ARGV[4..]  entry ids
--
-- Returns: one status per entry id, in order: 1 re-added, acked + deleted (its starts field
-- removed: the new entry starts afresh); 0 pending for another consumer (left to its new
-- owner); -1 pending for no one (already settled, or deleted), or owned with its body deleted
-- (left pending for the reclaimer to record).
-- Under maxmemory (noeviction) the re-adds are refused: the call fails with nothing changed
-- (every XADD runs before any XACK/XDEL) and the entries are reclaimed after lock expiry.
local stream, starts, memo, tracked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer = ARGV[1], ARGV[2]
local before = redis.call('GET', memo)
if before then return memo_decode(before) end

local out, moved, added = {}, {}, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local s = settle_status(stream, group, consumer, id)
  if s == APPLIED then
    local e = redis.call('XRANGE', stream, id, id)
    if #e > 0 then
      local fields = e[1][2]
      if fields[1] == 'due' and fields[2] == '' then
        fields[2] = id_ms(id)
      end
      local ok, new_id = pcall(redis.call, 'XADD', stream, '*', unpack(fields))
      if not ok then
        -- Refused (out of memory): take back the re-adds so far, so that the failed call
        -- leaves no copy behind, and fail with Redis's error.
        for _, a in ipairs(added) do redis.call('XDEL', stream, a) end
        error(new_id, 0)
      end
      added[#added + 1] = new_id
      moved[#moved + 1] = id
      if ctl_of(fields) then
        local cur = redis.call('HGET', tracked, fields[4])
        local rec = cur and cjson.decode(cur)
        if rec and rec.e == id then
          -- pcall: the re-adds and acks must go through whatever happens to the record.
          pcall(redis.call, 'HSET', tracked, fields[4],
            cjson.encode({e = new_id, k = rec.k, x = rec.x}))
        end
      end
    else
      s = GONE
    end
  end
  out[#out + 1] = s
end
-- One XACK, XDEL and HDEL per 500 ids (unpack is bounded by Lua's stack).
for i = 1, #moved, 500 do
  local ids = {unpack(moved, i, math.min(i + 499, #moved))}
  redis.call('XACK', stream, group, unpack(ids))
  redis.call('XDEL', stream, unpack(ids))
  redis.call('HDEL', starts, unpack(ids))
end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, memo_encode(out), 'PX', ARGV[3])
return out
