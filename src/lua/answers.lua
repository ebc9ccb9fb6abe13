-- Read a model's histogram of answer sizes (the reservations learned from usage; settle.lua
-- counts them).
-- KEYS[1]: the model's histogram. ARGV[1]: its number of buckets.
-- Returns the count of each bucket, from the first (0 where none was counted).
local fields = {}
for bucket = 0, tonumber(ARGV[1]) - 1 do
  fields[#fields + 1] = tostring(bucket)
end
local counts = call('HMGET', KEYS[1], unpack(fields))
for i = 1, #counts do
  counts[i] = tonumber(counts[i]) or 0
end
return counts
