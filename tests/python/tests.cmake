# The Python package's tests with real PyTorch, Debian's route (tests/python): /usr/bin/python3
# with python3-torch, fragscope._core from this build and the c10 hook built here against
# libtorch-dev: the virtual GPU's hook, its API, threads and fork, its agreement with
# capture_trace.py + `fragscope replay`, the Monitor and the live loop. The same package on PyPI's
# torch 2.x, installed with pip, is tests/user_env (tools/run_tests.sh). Registered only where
# both native parts are built (never under the sanitizers); run by hand without them, they skip.
# python_test_deps: what that test runs, so tools/run_tests.sh builds only it in the dev preset.
add_custom_target(python_test_deps)
if(TARGET fragscope_core AND TARGET fragscope_torch_hook)
  add_dependencies(python_test_deps fragscope fragscope_core fragscope_torch_hook)
  add_test(NAME python_virtual_gpu
    COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/python)
  set_tests_properties(python_virtual_gpu PROPERTIES
    ENVIRONMENT "FRAGSCOPE_NATIVE_DIR=$<TARGET_FILE_DIR:fragscope_core>;FRAGSCOPE_TORCH_HOOK=$<TARGET_FILE:fragscope_torch_hook>;FRAGSCOPE_BIN=$<TARGET_FILE:fragscope>;FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR};PYTHONDONTWRITEBYTECODE=1"
    LABELS python
    TIMEOUT 900)
endif()
