-- dead_retry: put dead letters back on their shard's stream as fresh jobs (attempt 1, due now).
-- Each dead letter is re-added and removed from the dead stream in this one call, so two
-- operators retrying the same id at once re-add it once: the second finds nothing.
-- A record without the envelope (a lost payload) has nothing to run: it is left in place.
--
-- KEYS[1]  stream    KEYS[2]  dead stream
-- ARGV[1]  F, the number of envelope field names
-- ARGV[2 .. 1+F]  the envelope field names, in stream order ('due' and 'attempt' are reset)
-- ARGV[2+F ..]  dead-letter entry ids
--
-- Returns: one integer per id, in order: 1 re-enqueued, 0 not found, -1 not a job (kept).
local stream, dead = KEYS[1], KEYS[2]
local nf = tonumber(ARGV[1])
local out = {}
for a = 2 + nf, #ARGV do
  local id = ARGV[a]
  local found = redis.call('XRANGE', dead, id, id)
  if #found == 0 then
    out[#out + 1] = 0
  else
    local flat = found[1][2]
    local record = {}
    for i = 1, #flat, 2 do
      if record[flat[i]] == nil then record[flat[i]] = flat[i + 1] end
    end
    local fields = {}
    local complete = true
    for i = 1, nf do
      local name = ARGV[1 + i]
      local value = record[name]
      if value == nil then
        complete = false
        break
      end
      if name == 'due' then
        value = ''
      elseif name == 'attempt' then
        value = '1'
      end
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
    if complete then
      redis.call('XADD', stream, '*', unpack(fields))
      redis.call('XDEL', dead, id)
      out[#out + 1] = 1
    else
      out[#out + 1] = -1
    end
  end
end
return out
