fragscope_add_test(model/allocator_rules_test.cc LIBS fragscope_model)
fragscope_add_test(model/size_class_test.cc LIBS fragscope_model)
fragscope_add_test(model/device_memory_test.cc LIBS fragscope_model)
fragscope_add_test(model/random_replay_test.cc LIBS fragscope_analysis)
fragscope_add_test(model/alloc_conf_test.cc LIBS fragscope_model)

# The alloc_conf fuzz target's corpus, replayed without libFuzzer (as sources/tests.cmake does
# for trace_reader), so every seed and saved crash input runs in the normal test suite.
add_executable(alloc_conf_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/alloc_conf_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(alloc_conf_fuzz_replay PRIVATE fragscope_model)
fragscope_set_warnings(alloc_conf_fuzz_replay)
add_test(NAME alloc_conf_fuzz_replay
  COMMAND alloc_conf_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/alloc_conf)
fragscope_add_test(model/caching_allocator_sim_test.cc LIBS fragscope_model)
fragscope_add_test(model/btree_map_test.cc LIBS fragscope_model)
fragscope_add_test(model/sim_differential_test.cc LIBS fragscope_model)
fragscope_add_test(model/seed_requests_test.cc LIBS fragscope_model)
fragscope_add_test(model/recorded_addresses_test.cc LIBS fragscope_model)
fragscope_add_test(model/request_extractor_test.cc LIBS fragscope_model)
fragscope_add_test(model/segregated_free_set_test.cc LIBS fragscope_model)
fragscope_add_test(model/sim_free_set_regression_test.cc LIBS fragscope_model)
fragscope_add_test(model/request_replayer_test.cc LIBS fragscope_model)
fragscope_add_test(model/bfc_allocator_sim_test.cc LIBS fragscope_model)
fragscope_add_test(model/bfc_property_test.cc LIBS fragscope_model)
