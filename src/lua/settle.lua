-- Settle the token budgets of streams that ended (docs/design.md, "Token budgets"): charge what a
-- stream used beyond what it reserved, or give back what it reserved and did not use, to the
-- buckets it was taken from (a bucket that left its window no longer counts: nothing to give),
-- and count its answer's size in its identity's histogram of the model, whose size is its one
-- count in the model's histogram (the reservations learned from usage; src/rate/answer_sizes.rs
-- has the rule).
-- Applied at most once: a call whose answer was lost is sent again with the same marker.
-- KEYS[1]: the settlement's marker; then the budgets' counters and the two histograms (one hash
-- slot in a cluster).
-- ARGV[1]: the KEYS index of the model's histogram, 0 for no answer to count; ARGV[2]: the
-- answer's bucket in it (0 to 31, computed by the caller); ARGV[3]: the KEYS index of the
-- identity's own histogram of the model; ARGV[4]: the percentile that sizes an identity. Then
-- per adjustment: its KEYS index, algorithm, window in ms, tokens, a bucket: '0' to charge the
-- tokens now (even above the limit), else to give back up to that many from it, and the
-- counter's epoch when they were taken (a counter rebuilt since has another: nothing to give
-- back there).
-- Returns the tokens given back, or -1 if the settlement had been applied already.
local SETTLED_MS = 600000
-- A histogram is kept a week after its last answer.
local ANSWERS_MS = 7 * 86400000

-- Counts an answer in bucket `bucket` of the identity's histogram `own`, and moves the
-- identity's one count in the model's histogram `model` to the bucket that now holds its
-- `percentile`th answer (nearest rank; field 'r' of `own` says where that count is).
local function count_answer(model, own, bucket, percentile)
  call('HINCRBY', own, bucket, 1)
  local fields = call('HGETALL', own)
  local counts, total, was = {}, 0, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'r' then
      was = fields[i + 1]
    else
      local count = tonumber(fields[i + 1])
      counts[#counts + 1] = {tonumber(fields[i]), count}
      total = total + count
    end
  end
  table.sort(counts, function(a, b) return a[1] < b[1] end)
  local rank, seen, size = math.floor((total * percentile + 99) / 100), 0, nil
  for _, entry in ipairs(counts) do
    seen = seen + entry[2]
    if seen >= rank then
      size = integer(entry[1])
      break
    end
  end
  if size ~= was then
    -- A model's histogram lost meanwhile (a restart) has no count there to move.
    if was and (tonumber(call('HGET', model, was)) or 0) > 0 then
      call('HINCRBY', model, was, -1)
    end
    call('HINCRBY', model, size, 1)
    call('HSET', own, 'r', size)
  end
  call('PEXPIRE', own, ANSWERS_MS)
  call('PEXPIRE', model, ANSWERS_MS)
end

--[[ per call ]]
if not call('SET', KEYS[1], 1, 'NX', 'PX', SETTLED_MS) then
  return -1
end
local answers = tonumber(ARGV[1])
if answers > 0 then
  count_answer(KEYS[answers], KEYS[tonumber(ARGV[3])], ARGV[2], tonumber(ARGV[4]))
end
read_clock()
local given = 0
for at = 5, #ARGV, 6 do
  local key, algorithm, window = KEYS[tonumber(ARGV[at])], ARGV[at + 1], tonumber(ARGV[at + 2])
  local tokens, slot, epoch = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  if slot == 0 then
    look_rate(key, algorithm, window).take(tokens)
  else
    given = given + give_back(key, algorithm, slot, epoch, tokens)
  end
end
return given
