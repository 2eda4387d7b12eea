-- progress: record a running tracked job's progress in its location record, fenced on the
-- entry and its owner: a worker that lost the job (or a job that already finished) changes
-- nothing.
--
-- KEYS[1]  tracked hash    KEYS[2]  stream
-- ARGV[1]  job id    ARGV[2]  entry id    ARGV[3]  fraction done (0..1)
-- ARGV[4]  detail (JSON text, or '' for none)    ARGV[5]  group    ARGV[6]  consumer
--
-- Returns: 1 recorded; 0 the record is gone, names another entry, or the entry is not
-- pending for this consumer.
local tracked, stream, jid, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local cur = redis.call('HGET', tracked, jid)
if not cur then return 0 end
local rec = cjson.decode(cur)
if rec.e ~= id or owner(stream, ARGV[5], id) ~= ARGV[6] then return 0 end
rec.p = tonumber(ARGV[3])
if ARGV[4] == '' then rec.d = nil else rec.d = ARGV[4] end
redis.call('HSET', tracked, jid, cjson.encode(rec))
return 1
