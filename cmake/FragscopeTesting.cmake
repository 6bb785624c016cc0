include(GoogleTest)

# fragscope_add_test(model/device_memory_test.cc [LIBS ...]): one gtest binary per file,
# named after the file (model_device_memory_test), linked with the stage libraries it uses.
function(fragscope_add_test source)
  cmake_parse_arguments(ARG "" "" "LIBS" ${ARGN})
  string(REGEX REPLACE "\\.cc$" "" name "${source}")
  string(REPLACE "/" "_" name "${name}")
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} fragscope_testing GTest::gtest_main)
  fragscope_set_warnings(${name})
  gtest_discover_tests(${name}
    PROPERTIES ENVIRONMENT "FRAGSCOPE_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()
