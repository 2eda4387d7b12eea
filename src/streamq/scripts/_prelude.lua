-- Shared helpers, prepended to every script at load time (never called on its own).

-- Server time in milliseconds: due dates and windows never depend on a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- True when entry `id` is pending in `group` for `consumer`. This is the fence: XACK and
-- XCLAIM accept any consumer name, so every settle and renewal asks first.
local function owned(stream, group, consumer, id)
  local ok, p = pcall(redis.call, 'XPENDING', stream, group, id, id, 1, consumer)
  return ok and #p > 0
end

-- The millisecond part of a stream entry id ("1700000000000-3" -> "1700000000000").
local function id_ms(id)
  return string.match(id, '^(%d+)')
end
