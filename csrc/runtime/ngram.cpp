#include "ngram.h"

#include <algorithm>

namespace ssd::runtime {

std::vector<int32_t> ngram_propose(const std::vector<int32_t>& tokens, int64_t k, int64_t max_n) {
  std::vector<int32_t> out;
  if (k <= 0 || tokens.empty()) return out;
  const auto len = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> seq = tokens;  // grows with the proposals
  for (int64_t n = std::min(max_n, len - 1); n >= 1; --n) {
    // Latest earlier start i with tokens[i, i + n) == the last n tokens.
    for (int64_t i = len - n - 1; i >= 0; --i) {
      if (!std::equal(tokens.begin() + i, tokens.begin() + i + n, tokens.end() - n)) continue;
      for (int64_t j = 0; j < k; ++j) seq.push_back(seq[static_cast<size_t>(i + n + j)]);
      return {seq.begin() + len, seq.end()};
    }
  }
  return std::vector<int32_t>(static_cast<size_t>(k), tokens.back());
}

int64_t proposal_emitted(const std::vector<int32_t>& text, int64_t at, const std::vector<int32_t>& proposal) {
  const auto n = static_cast<int64_t>(proposal.size());
  const int64_t known = std::max<int64_t>(0, static_cast<int64_t>(text.size()) - at);
  int64_t agree = 0;
  while (agree < std::min(n, known) && text[static_cast<size_t>(at + agree)] == proposal[static_cast<size_t>(agree)])
    ++agree;
  return agree == known && agree < n ? -1 : agree + 1;
}

}  // namespace ssd::runtime
