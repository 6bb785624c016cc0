# CLI golden tests: pytest drives the built `fragscope` binary over the hand-made traces in
# tests/data/cli (tests/cli/test_analyze.py). FRAGSCOPE_UPDATE_GOLDEN=1 rewrites the goldens.
add_test(NAME cli_pytest
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/cli)
set_tests_properties(cli_pytest PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
  LABELS cli
  TIMEOUT 300)
# `fragscope gpus` (tests/cli/test_gpus.py) loads the stand-in libnvidia-ml built by the tests.
set_property(TEST cli_pytest APPEND PROPERTY ENVIRONMENT
  "FRAGSCOPE_FAKE_NVML=$<TARGET_FILE:fake_nvml_full>")
