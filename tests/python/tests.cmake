# The Python package's tests with real PyTorch (tests/python): the virtual GPU's hook, its API,
# threads and fork, and its agreement with capture_trace.py + `fragscope replay`. Registered
# only where the native module is built (never under the sanitizers); run by hand without it,
# they skip.
if(TARGET _fragscope_native)
  add_test(NAME python_virtual_gpu
    COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/python)
  set_tests_properties(python_virtual_gpu PROPERTIES
    ENVIRONMENT "FRAGSCOPE_NATIVE_DIR=$<TARGET_FILE_DIR:_fragscope_native>;FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
    LABELS python
    TIMEOUT 900)
endif()
