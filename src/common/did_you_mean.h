// "Did you mean ...": the closest of a set of known words to a mistyped one, for error messages
// (unknown commands, flags, labels).
#ifndef FRAGSCOPE_COMMON_DID_YOU_MEAN_H_
#define FRAGSCOPE_COMMON_DID_YOU_MEAN_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fragscope {

/// Optimal-string-alignment distance (insertions, deletions, substitutions and swaps of two
/// adjacent characters each count 1), compared case-insensitively.
std::size_t EditDistance(std::string_view a, std::string_view b);

/// The candidate closest to `word` if it is close enough to be a typo: at most 1 edit for words
/// of up to 4 characters, 2 up to 8, else 3; or `word` is a prefix of exactly one candidate
/// ("--cap" → "--capacity"). Ties go to the earlier candidate. nullopt when nothing is close.
std::optional<std::string> ClosestMatch(std::string_view word,
                                        const std::vector<std::string>& candidates);

/// " (did you mean 'X'?)" for ClosestMatch, or "".
std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_DID_YOU_MEAN_H_
