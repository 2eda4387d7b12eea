-- progress: record a running tracked job's progress in its location record, fenced on the
-- entry: a worker that lost the job (or a job that already finished) changes nothing.
--
-- KEYS[1]  tracked hash
-- ARGV[1]  job id    ARGV[2]  entry id    ARGV[3]  fraction done (0..1)
-- ARGV[4]  detail (JSON text, or '' for none)
--
-- Returns: 1 recorded; 0 the record is gone or names another entry.
local tracked, jid, id = KEYS[1], ARGV[1], ARGV[2]
local cur = redis.call('HGET', tracked, jid)
if not cur then return 0 end
local rec = cjson.decode(cur)
if rec.e ~= id then return 0 end
rec.p = tonumber(ARGV[3])
if ARGV[4] == '' then rec.d = nil else rec.d = ARGV[4] end
redis.call('HSET', tracked, jid, cjson.encode(rec))
return 1
