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

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_TESTING_TEST_UTIL_H_
