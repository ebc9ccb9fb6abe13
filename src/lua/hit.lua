-- Count one hit against several rate policies of one identity at once, all or nothing: a hit
-- refused by one policy consumes from none. Design: docs/design.md ("Rate limits").
-- One call counts a batch of hits, in order (packed as the prelude's decide_each says); each
-- hit's KEYS and ARGV:
-- KEYS[i]: the counter of policy i (same hash tag).
-- ARGV[1]: '1' to consume when every policy allows, '0' to only look (peek); then per policy:
-- algorithm ('s' sliding window, 'f' fixed window; 'd', 'w', 'm' a fixed window to the next
-- UTC day, ISO week or month boundary), limit, window in ms, cost (units the hit
-- takes from it; 'cost ahead' also asks for units ahead, which the process serves hits from
-- itself: see the prelude's RATE_ARGS), enforce ('1'; '0': a dry run, which never refuses and, when the hit is
-- counted, takes its cost whatever its room).
-- Sliding window: the counter is a hash of SLICES + 1 slices (slice start / slice length ->
-- units) and its epoch ('e', see the prelude's look_rate); every slice that overlaps the last
-- window counts in full, so no window of that length ever holds more than the limit (a hit may
-- be refused up to one slice early).
-- Fixed window (the article's): a hash of the units ('c') and the window's end ('x'), started by
-- the first hit and expiring at its end (a calendar window's end is its next boundary, on the
-- server's clock); a counter found without expiry gets one (repaired), so no key is left
-- forever.
-- Returns per hit (in a list; a call of one hit, its reply alone: see the prelude's
-- decide_each) {refused, retry_ms, then per policy used, reset_ms, bucket, epoch, over}:
-- refused is the 1-based index of the first enforced policy that refused (0: allowed), retry_ms
-- when that policy has room for its cost again; used counts units in use after this hit (before it
-- when refused or only looking), reset_ms is when the policy's next units free up (0: nothing
-- in use), bucket and epoch where the cost went (see the prelude's look_rate; 0: nothing taken),
-- over 1 when the policy had no room for the cost (it refused, or would have if enforced);
-- a policy asked for units ahead adds how many it took ahead and for how many ms they may be
-- served (see the prelude's answer_rates).
read_clock()
return decide_each(KEYS, ARGV, function(keys, kb, kn, args, ab)
  local states, refused, retry = look_rates(keys, kb + 1, kb + kn, args, ab + 2, 1)
  local reply = {refused, retry}
  answer_rates(reply, states, args[ab + 1] == '1' and refused == 0)
  return reply
end)
