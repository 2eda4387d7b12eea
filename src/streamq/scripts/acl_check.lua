-- acl_check: which of the given commands the calling ACL user may run, without running any.
-- Used by a worker's start-up permission check when the user may not run ACL DRYRUN: a script
-- runs with its caller's permissions, so redis.acl_check_cmd (Redis 7+) answers for the caller.
--
-- KEYS[1]  a key under the checked prefix (never touched; it routes the call on a cluster)
-- ARGV[1..] the commands, each as its length then its words: 2, 'xlen', '<key>', ...
--
-- Returns: per command, 1 allowed, 0 refused, -1 the command is unknown to this server
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local words = {}
  for j = 1, n do words[j] = ARGV[i + j] end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if not ok then
    out[#out + 1] = -1
  elseif allowed then
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  i = i + n + 1
end
return out
