-- Read the histograms of answer sizes a stream's reservation is learned from (settle.lua
-- counts them): its model's, one count per identity, and its identity's own.
-- KEYS[1]: the model's histogram; KEYS[2], when given: the identity's own. ARGV[1]: the number of
-- buckets of each.
-- Returns the count of each bucket of the model's, from the first, then of the identity's when
-- given (0 where none was counted).
local fields = {}
for bucket = 0, tonumber(ARGV[1]) - 1 do
  fields[#fields + 1] = tostring(bucket)
end
local counts = {}
for _, key in ipairs(KEYS) do
  for _, count in ipairs(call('HMGET', key, unpack(fields))) do
    counts[#counts + 1] = tonumber(count) or 0
  end
end
return counts
