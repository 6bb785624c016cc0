# `fragscope serve` with real components (tests/integration/test_serve.py): the built binary,
# the Python agent client, promtool and Debian's prometheus server, and a short soak run.
# FRAGSCOPE_REQUIRE_TOOLS=1: a missing promtool, prometheus, systemd-analyze or stand-in NVML
# fails the test instead of skipping it (tools/install-deps.sh installs the tools).
add_test(NAME serve_integration
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${PROJECT_SOURCE_DIR}/tests/integration/test_serve.py)
set_tests_properties(serve_integration PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1;FRAGSCOPE_REQUIRE_TOOLS=1"
  LABELS integration
  TIMEOUT 400)
# The daemon loads the tests' stand-in libnvidia-ml through its --nvml-lib path.
set_property(TEST serve_integration APPEND PROPERTY ENVIRONMENT
  "FRAGSCOPE_FAKE_NVML=$<TARGET_FILE:fake_nvml_full>")
# Hostile neighbours (tests/integration/test_serve_hostile.py): slowloris HTTP clients,
# trickling and flooding agents, series floods; each case bounded in time.
add_test(NAME serve_hostile
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${PROJECT_SOURCE_DIR}/tests/integration/test_serve_hostile.py)
set_tests_properties(serve_hostile PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration
  TIMEOUT 200)
# `fragscope probe` and the Server Scout plugin against a live daemon (docs/live-monitoring.md).
add_test(NAME probe_integration
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${PROJECT_SOURCE_DIR}/tests/integration/test_probe.py)
set_tests_properties(probe_integration PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration
  TIMEOUT 120)
# Trust on a node (tests/integration/test_serve_trust.py): another UID (65534) tries to report
# for, checkpoint and crowd out this user's processes; skipped when not run as root.
add_test(NAME serve_trust
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider -rs
          ${PROJECT_SOURCE_DIR}/tests/integration/test_serve_trust.py)
set_tests_properties(serve_trust PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration
  TIMEOUT 200)
# `fragscope top` against a daemon fed by two agent processes (issue 33 item 3): the process
# API, `top --once`, and the live view in tmux at 80x24 (send-keys, capture-pane).
# FRAGSCOPE_REQUIRE_TOOLS=1: a missing tmux fails instead of skipping (tools/install-deps.sh).
add_test(NAME top_integration
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${PROJECT_SOURCE_DIR}/tests/integration/test_top.py)
set_tests_properties(top_integration PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1;FRAGSCOPE_REQUIRE_TOOLS=1"
  LABELS integration
  TIMEOUT 120)
