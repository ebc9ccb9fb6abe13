-- Settle the token budgets of streams that ended (docs/design.md, "Token budgets"): charge what a
-- stream used beyond what it reserved, or give back what it reserved and did not use, to the
-- buckets it was taken from (a bucket that left its window no longer counts: nothing to give),
-- and count its answer's size in its model's histogram (the reservations learned from usage).
-- Applied at most once: a call whose answer was lost is sent again with the same marker.
-- KEYS[1]: the settlement's marker; then the budgets' counters and the model's histogram (one
-- hash slot in a cluster).
-- ARGV[1]: the KEYS index of the model's histogram, 0 for no answer to count; ARGV[2]: the
-- answer's bucket in it (0 to 31, computed by the caller). Then per adjustment: its KEYS index,
-- algorithm, window in ms, tokens, a bucket: '0' to charge the tokens now (even above the
-- limit), else to give back up to that many from it, and the counter's epoch when they were
-- taken (a counter rebuilt since has another: nothing to give back there).
-- Returns the tokens given back, or -1 if the settlement had been applied already.
local SETTLED_MS = 600000
-- A model's histogram is kept a week after its last answer.
local ANSWERS_MS = 7 * 86400000
if not call('SET', KEYS[1], 1, 'NX', 'PX', SETTLED_MS) then
  return -1
end
local answers = tonumber(ARGV[1])
if answers > 0 then
  call('HINCRBY', KEYS[answers], ARGV[2], 1)
  call('PEXPIRE', KEYS[answers], ANSWERS_MS)
end
read_clock()
local given = 0
for at = 3, #ARGV, 6 do
  local key, algorithm, window = KEYS[tonumber(ARGV[at])], ARGV[at + 1], tonumber(ARGV[at + 2])
  local tokens, slot, epoch = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  if slot == 0 then
    look_rate(key, algorithm, window).take(tokens)
  else
    given = given + give_back(key, algorithm, slot, epoch, tokens)
  end
end
return given
