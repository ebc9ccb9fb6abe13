-- Forget rate counters: support staff giving an identity a fresh allowance.
-- Design: docs/design.md ("Rate limits").
-- KEYS: the counters (same hash tag). ARGV: none. Returns how many existed.
-- Each counter's alerts told (prelude's told_first: the counter's key and ':told') go with it,
-- so the fresh allowance's thresholds are told again.
local told = {}
for i, key in ipairs(KEYS) do
  told[i] = key .. ':told'
end
call('DEL', unpack(told))
return call('DEL', unpack(KEYS))
