-- track_final: write a tracked job's final record when the script that settled it could not
-- name the key (reclaim dead-letters stalled jobs it finds by scanning the pending list).
--
-- KEYS[1]  the job's final record (result:<job id>)
-- ARGV[1]  keep ms    ARGV[2]  the record (JSON object; the time is added here)
--
-- Returns: 1
local final = KEYS[1]
local record = cjson.decode(ARGV[2])
record.at = now_ms()
redis.call('DEL', final)
if pcall(redis.call, 'RPUSH', final, cjson.encode(record)) then
  redis.call('PEXPIRE', final, tonumber(ARGV[1]))
end
return 1
