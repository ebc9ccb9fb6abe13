-- The first step of a prune: list the leases a live holder has members of in one tag that are
-- none of those it keeps (a release lost in a failover or an AOF restore, an acquire whose
-- result never reached its caller). Changes nothing: the process then drops from the list the
-- leases held or in flight by then (a grant made since this call was sent is one of those), and
-- prune.lua removes the rest by id. Run only when the holder's count exceeds what it holds.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants; section 7).
-- KEYS[1]: the tag's holders. ARGV[1]: holder id; ARGV[2]: the most lease ids to list;
-- ARGV[3..]: the ids of the leases the holder holds in the tag or has in flight there (acquires
-- sent, releases not confirmed) when the call is sent.
-- Returns {id_1, weight_1, id_2, weight_2, ...}: each lease id listed once, with the highest unit
-- of its members found (a lease of weight w has members id, id#2, ..., id#w).
local holders = KEYS[1]
local holder = holder_name(ARGV[1])
local most = tonumber(ARGV[2])
local keep = {}
for i = 3, #ARGV do
  keep[ARGV[i]] = true
end
local units = {}
local listed = {}
for _, pool in ipairs(call('SMEMBERS', holders .. ':' .. holder)) do
  for _, member in ipairs(call('ZRANGEBYSCORE', pool, holder, holder)) do
    local id = string.match(member, '^[^#]+')
    if not keep[id] then
      local unit = tonumber(string.match(member, '#(%d+)$')) or 1
      if units[id] then
        units[id] = math.max(units[id], unit)
      elseif #listed < most then
        units[id] = unit
        listed[#listed + 1] = id
      end
    end
  end
end
local reply = {}
for _, id in ipairs(listed) do
  reply[#reply + 1] = id
  reply[#reply + 1] = units[id]
end
return reply
