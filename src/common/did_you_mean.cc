#include "common/did_you_mean.h"

#include <algorithm>
#include <cctype>

namespace fragscope {

std::size_t EditDistance(std::string_view a, std::string_view b) {
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  };
  const std::size_t n = a.size(), m = b.size();
  // Three rows: i-2, i-1, i.
  std::vector<std::size_t> before(m + 1), previous(m + 1), current(m + 1);
  for (std::size_t j = 0; j <= m; ++j) previous[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = same(a[i - 1], b[j - 1]) ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1])) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[m];
}

std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates) {
  if (word.empty()) return std::nullopt;
  const std::size_t allowed = word.size() <= 4 ? 1 : word.size() <= 8 ? 2 : 3;
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const std::string& c : candidates) {
    const std::size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best) return best;
  std::optional<std::string> prefix_of;
  for (const std::string& c : candidates) {
    if (c.size() > word.size() && std::string_view(c).substr(0, word.size()) == word) {
      if (prefix_of) return std::nullopt;  // ambiguous
      prefix_of = c;
    }
  }
  return prefix_of;
}

std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::optional<std::string> match = ClosestMatch(word, candidates);
  return match ? " (did you mean '" + *match + "'?)" : std::string();
}

}  // namespace fragscope
