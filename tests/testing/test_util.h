// Small helpers for tests: where fixtures live, reading a file whole.
#ifndef FRAGSCOPE_TESTS_TESTING_TEST_UTIL_H_
#define FRAGSCOPE_TESTS_TESTING_TEST_UTIL_H_

#include <string>

namespace fragscope::testing {

/// Absolute path of `relative` inside the source tree (e.g. "tests/data/sample/x.jsonl.gz").
std::string SourcePath(const std::string& relative);

/// The whole content of a file; fails the current test (ADD_FAILURE) and returns "" on error.
std::string ReadFileOrDie(const std::string& path);

/// A fresh empty directory under the system temp dir, unique per call.
std::string MakeTempDir();

/// How many times to repeat a test that gains breadth by repetition (random traces): `n` in
/// the plain builds, a fifth of it (at least 1) under the sanitizers, which run each repetition
/// 5-20 times slower and look for memory errors, not for rarer seeds.
inline constexpr int Repetitions(int n) {
#if defined(__SANITIZE_ADDRESS__)
  return n / 5 > 0 ? n / 5 : 1;
#else
  return n;
#endif
}

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_TESTING_TEST_UTIL_H_
