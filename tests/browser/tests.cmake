# The HTML report in a real browser (tests/browser/test_report_browser.py): headless Chromium
# loads `fragscope report` pages over its DevTools protocol and checks them on screenshots,
# written to build/<preset>/browser-screenshots. Skips itself when chromium is missing.
add_test(NAME browser_report_pytest
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/browser)
set_tests_properties(browser_report_pytest PROPERTIES
  ENVIRONMENT "FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};FRAGSCOPE_SCREENSHOT_DIR=${PROJECT_BINARY_DIR}/browser-screenshots;PYTHONDONTWRITEBYTECODE=1"
  LABELS browser
  TIMEOUT 600)
