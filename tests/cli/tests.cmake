# CLI golden tests: pytest drives the built `fragscope` binary over the hand-made traces in
# tests/data/cli (tests/cli/test_analyze.py). FRAGSCOPE_UPDATE_GOLDEN=1 rewrites the goldens.
# One ctest entry per test file, so ctest -j runs them side by side and a slow file (under the
# sanitizers, on a busy machine) has its own timeout.
file(GLOB FRAGSCOPE_CLI_TEST_FILES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/cli/test_*.py)
foreach(test_file IN LISTS FRAGSCOPE_CLI_TEST_FILES)
  get_filename_component(stem ${test_file} NAME_WE)
  string(REGEX REPLACE "^test_" "cli_" test_name ${stem})
  add_test(NAME ${test_name}
    COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${test_file})
  set_tests_properties(${test_name} PROPERTIES
    ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1;FRAGSCOPE_SANITIZED=$<BOOL:${FRAGSCOPE_SANITIZE}>"
    LABELS cli
    TIMEOUT 600)
  # `fragscope gpus` (tests/cli/test_gpus.py) loads the stand-in libnvidia-ml built by the tests.
  set_property(TEST ${test_name} APPEND PROPERTY ENVIRONMENT
    "FRAGSCOPE_FAKE_NVML=$<TARGET_FILE:fake_nvml_full>")
endforeach()
