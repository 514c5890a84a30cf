// The fast fallback speculator: prompt lookup over the sequence's own tokens.
// It proposes what followed the most recent earlier occurrence of the
// sequence's last n tokens (n from max_n down to 1). Its proposals are
// deterministic, so the verifier treats them as one-hot q.
#pragma once

#include <cstdint>
#include <vector>

namespace ssd::runtime {

/// k proposals continuing `tokens`. Without any match the last token is
/// repeated; a match too close to the end keeps reading into its own proposals.
std::vector<int32_t> ngram_propose(const std::vector<int32_t>& tokens, int64_t k, int64_t max_n = 3);

/// Tokens a round verifying `proposal` (made when the text had `at` tokens)
/// emits, read off the text committed since: the proposal's agreeing prefix
/// plus one. -1 while the text agrees with every proposed token it has.
int64_t proposal_emitted(const std::vector<int32_t>& text, int64_t at, const std::vector<int32_t>& proposal);

}  // namespace ssd::runtime
