-- complete: acknowledge and delete finished entries, fenced on ownership.
-- A re-sent call (same token) returns the first send's reply, not what it finds now: a
-- reply lost after the script ran must not read as "settled by someone else".
--
-- KEYS[1]  stream    KEYS[2]  starts hash    KEYS[3]  this call's memo (settled:<token>)
-- ARGV[1]  group     ARGV[2]  consumer       ARGV[3]  memo lifetime ms
-- ARGV[4..]  entry ids
--
-- Returns: one status per entry id, in order: 1 acked + deleted (and its starts field
-- removed); 0 pending for another consumer (the lock was lost: left to its new owner,
-- untouched); -1 pending for no one (already settled, or deleted).
-- Under maxmemory (noeviction) it still acks and deletes (XACK, XDEL and HDEL are never
-- refused); only the memo may be skipped.
local stream, starts, memo = KEYS[1], KEYS[2], KEYS[3]
local group, consumer = ARGV[1], ARGV[2]
local before = redis.call('GET', memo)
if before then return memo_decode(before) end

local out, done = {}, {}
local function flush()
  -- One XACK, XDEL and HDEL for many ids: each redis.call costs more than the work it does.
  redis.call('XACK', stream, group, unpack(done))
  redis.call('XDEL', stream, unpack(done))
  redis.call('HDEL', starts, unpack(done))
  done = {}
end
for i = 4, #ARGV do
  local id = ARGV[i]
  local s = settle_status(stream, group, consumer, id)
  out[#out + 1] = s
  if s == APPLIED then
    done[#done + 1] = id
    if #done == 500 then flush() end
  end
end
if #done > 0 then flush() end
-- pcall: the memo may be refused under maxmemory, the reply must still go out (_prelude.lua).
pcall(redis.call, 'SET', memo, memo_encode(out), 'PX', ARGV[3])
return out
