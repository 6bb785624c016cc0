# deploy/: Prometheus rules (promtool check + test rules), the Grafana dashboard, and the
# example alert config, checked with the real tools (tests/deploy/test_deploy.py).
# FRAGSCOPE_REQUIRE_TOOLS=1: a missing promtool fails instead of skipping.
add_test(NAME deploy_files
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/deploy)
set_tests_properties(deploy_files PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1;FRAGSCOPE_REQUIRE_TOOLS=1"
  LABELS deploy
  TIMEOUT 300)
