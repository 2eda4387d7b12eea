-- Shared helpers, prepended to every script at load time (never called on its own).

-- Server time in milliseconds: due dates and windows never depend on a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The consumer that entry `id` is pending for in `group`, or nil when it is pending for
-- no one (settled, deleted, never read, not an id, no such group). This is the fence: XACK
-- and XCLAIM accept any consumer name, so every settle and renewal asks first.
local function owner(stream, group, id)
  local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1)
  if ok and #p > 0 then return p[1][2] end
  return nil
end

-- What a settle finds for entry `id`: 1 pending for `consumer` (it may apply), 0 pending for
-- another consumer (the lock was lost), -1 pending for no one (already settled, or deleted).
local APPLIED, OTHER_OWNER, GONE = 1, 0, -1
local function settle_status(stream, group, consumer, id)
  local o = owner(stream, group, id)
  if o == consumer then return APPLIED end
  if o then return OTHER_OWNER end
  return GONE
end

-- A settle call's memo: its reply, one character per status, kept under the call's token so
-- that a re-sent call (its first reply was lost) answers what the first send did. Each settle
-- script GETs its memo key first and returns memo_decode(value) when it exists; after the work
-- it stores memo_encode(reply) with SET ... PX inside pcall: under maxmemory (noeviction) the
-- SET can be refused, and a settle that already acked must still return its reply (a script's
-- writes are not rolled back on error). Without the memo a re-send is answered from the state.
local MEMO_CHAR = {[APPLIED] = 'A', [OTHER_OWNER] = 'O', [GONE] = 'G'}
local MEMO_STATUS = {A = APPLIED, O = OTHER_OWNER, G = GONE}

local function memo_encode(statuses)
  local chars = {}
  for i, s in ipairs(statuses) do chars[i] = MEMO_CHAR[s] end
  return table.concat(chars)
end

local function memo_decode(value)
  local out = {}
  for i = 1, #value do out[i] = MEMO_STATUS[string.sub(value, i, i)] end
  return out
end

-- The millisecond part of a stream entry id ("1700000000000-3" -> "1700000000000").
local function id_ms(id)
  return string.match(id, '^(%d+)')
end

-- A tracked job's 'ctl' field (streamq.jobstatus) among an entry's flat fields, or nil. The
-- envelope's own eight fields come first, so untracked entries cost no loop at all.
local function ctl_of(fields)
  for i = 17, #fields, 2 do
    if fields[i] == 'ctl' then return fields[i + 1] end
  end
  return nil
end

-- A tracked job's final record (completed, cancelled, dead): one JSON element in a list that
-- expires after `keep` ms, so a waiter can block on it (BLMOVE). Under maxmemory the write
-- may be refused: the settle still goes through (pcall), only the record is missing.
local function write_final(final, record, keep)
  redis.call('DEL', final)
  if keep > 0 and pcall(redis.call, 'RPUSH', final, cjson.encode(record)) then
    redis.call('PEXPIRE', final, keep)
  end
end
