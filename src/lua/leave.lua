-- Take a waiter out of the line (it gave up, timed out or was cancelled). Idempotent.
-- KEYS[1]: the line; KEYS[2]: the waiters' liveness. ARGV[1]: waiter id.
-- Returns 1 if the waiter was in line, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
