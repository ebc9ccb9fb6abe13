-- Take a waiter out of the line (it gave up, timed out or was cancelled). Idempotent.
-- Design: docs/design.md (the keys, the holder and lease states, the invariants).
-- KEYS[1]: the line; KEYS[2]: the liveness of the processes that have waiters (KEYS[2]:<holder
-- id> is the set of that process's waiters, KEYS[2]:<holder id>:displaced those whose places
-- went to other users' waiters). ARGV[1]: waiter id; ARGV[2]: holder id.
-- Returns 1 if the waiter was in line, else 0.
local mine = KEYS[2] .. ':' .. holder_name(ARGV[2])
call('SREM', mine, ARGV[1])
call('HDEL', mine .. ':displaced', ARGV[1])
local was_in_line = call('ZSCORE', KEYS[1], ARGV[1]) and 1 or 0
forget_waiters(KEYS[1], {ARGV[1]})
return was_in_line
