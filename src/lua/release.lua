-- Release many leases in one call. Idempotent: releasing a lease that is gone does nothing.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS: every pool and the holders key of every tag named by the leases below, in any order
-- (one hash slot in a cluster), then, when ARGV[1] is not empty, the waiting line.
-- ARGV[1]: the channel to publish a wake-up on when someone waits (see the prelude's wake), or
-- ''; ARGV[2]: holder id;
-- then per lease: id, its shape (the prelude's shape_of): weight, the 1-based KEYS index of
-- its tag's holders, pool count k, and k 1-based KEYS indexes of its pools; and its tally taken
-- out, what its release takes from its holder's tally when all its members are there (see the
-- prelude's count_lease), as the core computed it, or ''.
-- The holder's index of pools is left as it is: a pool it no longer has members in leaves the
-- index when the keep-alive's sweep finds the pool gone (keepalive.lua), or when the reaper,
-- a prune or the manager's close (depart.lua) looks at it. So the index may list pools where
-- the holder has nothing left, never miss one where it has members, and a stream that comes
-- and goes costs its pool no index upkeep. The holder stays in the tag's holders with nothing
-- there, so its next acquire finds its entry alive instead of building it again: it leaves when
-- its manager closes (depart.lua), or, if it died, when the reaper finds its entry expired.
-- Returns, per lease in ARGV order (in a list; for a call of one lease, its answer alone), 1 if
-- it was still present in at least one pool, else 0; or, for a lease whose removal failed in a
-- pool (a key of another type there), the error's text: its members are removed from its other
-- pools all the same, and the others of the call are released (one bad lease failing the whole
-- call would fail every retry of it too).

-- Removes the members of the lease `id` of shape `shape` from its pools (in `keys`): how many
-- were there, and the text of the first error (a key of another type in one of its pools), if
-- any: its members leave its other pools all the same.
local function remove_lease(keys, id, shape)
  local removed, failure = 0, nil
  for j = 1, shape[3] do
    local done, count = pcall(remove_members, keys[shape[3 + j]], id, shape[1])
    if done then
      removed = removed + count
    else
      failure = failure or error_text(count)
    end
  end
  return removed, failure
end

-- Wakes the waiters of the line `keys[#keys]` on `channel` ('': none) when leases were
-- released and someone waits.
local function wake_waiters(keys, channel, released)
  if channel ~= '' and released > 0 and call('ZCARD', keys[#keys]) > 0 then
    wake(channel, released)
  end
end

--[[ per call ]]
local holder = ARGV[2] -- the core's decimal text, as stored
if #ARGV == 5 then
  -- One lease (a stream that ended): without the tables that gather many leases' tallies.
  local id, shape = ARGV[3], shape_of(ARGV[4])
  local removed, failure = remove_lease(KEYS, id, shape)
  if removed > 0 then
    local whole = removed == shape[1] * shape[3]
    count_lease(KEYS[shape[2]], holder, whole and ARGV[5] or '', -removed, id)
    wake_waiters(KEYS, ARGV[1], 1)
  end
  return failure or (removed > 0 and 1 or 0)
end
local released = 0
local present_each = {}
-- holders key -> the members removed in its tag, and the sum of their ids
local removed_in, removed_ids_in = {}, {}
local i = 3
while i <= #ARGV do
  local id = ARGV[i]
  local shape = shape_of(ARGV[i + 1])
  local holders = KEYS[shape[2]]
  local removed, failure = remove_lease(KEYS, id, shape)
  if removed > 0 then
    released = released + 1
    removed_in[holders] = (removed_in[holders] or 0) + removed
    removed_ids_in[holders] = (removed_ids_in[holders] or 0) + removed * id_value(id)
  end
  present_each[#present_each + 1] = failure or (removed > 0 and 1 or 0)
  i = i + 3
end
for holders, removed in pairs(removed_in) do
  count_members(holders, holder, -removed, -removed_ids_in[holders])
end
wake_waiters(KEYS, ARGV[1], released)
return present_each
