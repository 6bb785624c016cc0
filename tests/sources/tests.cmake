# Stage 1, sources: the trace format (src/sources/trace).
fragscope_add_test(sources/input_stream_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/trace_reader_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/trace_writer_test.cc LIBS fragscope_sources)

# Snapshot input (src/sources/document, src/sources/pickle).
fragscope_add_test(sources/document_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/pod_buffer_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/pickle_reader_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/json_document_test.cc LIBS fragscope_sources)
# PyTorch memory snapshots (src/sources/snapshot).
fragscope_add_test(sources/call_site_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/snapshot_decoder_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/document_json_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/snapshot_reader_test.cc LIBS fragscope_sources fragscope_analysis)
fragscope_add_test(sources/snapshot_steps_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/trace_history_test.cc LIBS fragscope_sources)
add_executable(snapshot_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/snapshot_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(snapshot_fuzz_replay PRIVATE fragscope_sources fragscope_analysis)
fragscope_set_warnings(snapshot_fuzz_replay)
add_test(NAME snapshot_fuzz_replay
  COMMAND snapshot_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/snapshot)

# The fuzz target's corpus, replayed without libFuzzer, so every saved seed and crash input runs
# in the normal test suite (fuzz/ itself is only added when FRAGSCOPE_BUILD_FUZZ is on).
add_executable(trace_reader_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/trace_reader_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(trace_reader_fuzz_replay PRIVATE fragscope_sources)
fragscope_set_warnings(trace_reader_fuzz_replay)
add_test(NAME trace_reader_fuzz_replay
  COMMAND trace_reader_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/trace_reader)

add_executable(pickle_reader_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/pickle_reader_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(pickle_reader_fuzz_replay PRIVATE fragscope_sources)
fragscope_set_warnings(pickle_reader_fuzz_replay)
add_test(NAME pickle_reader_fuzz_replay
  COMMAND pickle_reader_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/pickle_reader)

# Whole snapshot files: our fixtures, and the real ones in shared/ (read in place; never copied
# here because of their licences; skipped when shared/ is not beside the repository).
# A git worktree under <repo>/../wt/<name> finds shared/ one level further up.
set(_shared_snapshots "${PROJECT_SOURCE_DIR}/../shared/snapshots")
if(NOT IS_DIRECTORY "${_shared_snapshots}" AND
   IS_DIRECTORY "${PROJECT_SOURCE_DIR}/../../shared/snapshots")
  set(_shared_snapshots "${PROJECT_SOURCE_DIR}/../../shared/snapshots")
endif()
set(FRAGSCOPE_SHARED_SNAPSHOTS "${_shared_snapshots}" CACHE PATH
  "Folder with the real snapshots (real/, synthetic/) that snapshot_corpus_test reads in place")
fragscope_add_test(sources/snapshot_corpus_test.cc LIBS fragscope_sources)
target_compile_definitions(sources_snapshot_corpus_test PRIVATE
  FRAGSCOPE_SHARED_SNAPSHOTS="${FRAGSCOPE_SHARED_SNAPSHOTS}")
fragscope_add_test(sources/snapshot_stream_test.cc LIBS fragscope_sources)
target_compile_definitions(sources_snapshot_stream_test PRIVATE
  FRAGSCOPE_SHARED_SNAPSHOTS="${FRAGSCOPE_SHARED_SNAPSHOTS}")

# Differential test against Python's pickle: random values, every protocol.
add_executable(pickle_dump sources/pickle_dump_main.cc)
target_link_libraries(pickle_dump PRIVATE fragscope_sources)
fragscope_set_warnings(pickle_dump)
add_test(NAME pickle_differential
  COMMAND /usr/bin/python3 -m pytest -q -p no:cacheprovider
          ${CMAKE_CURRENT_SOURCE_DIR}/sources/test_pickle_differential.py)
set_tests_properties(pickle_differential PROPERTIES
  ENVIRONMENT "PICKLE_DUMP=$<TARGET_FILE:pickle_dump>;PYTHONDONTWRITEBYTECODE=1"
  TIMEOUT 300)

# GPU facts from outside the process (src/sources/gpu): NVML through the stand-in libraries of
# tests/testing/fake_nvml (their paths compiled in), /proc/driver/nvidia from fixture folders.
fragscope_add_test(sources/nvml_collector_test.cc LIBS fragscope_sources)
target_compile_definitions(sources_nvml_collector_test PRIVATE
  FAKE_NVML_FULL="$<TARGET_FILE:fake_nvml_full>"
  FAKE_NVML_OLD="$<TARGET_FILE:fake_nvml_old>"
  FAKE_NVML_R535="$<TARGET_FILE:fake_nvml_r535>"
  FAKE_NVML_NOINIT="$<TARGET_FILE:fake_nvml_noinit>")
add_dependencies(sources_nvml_collector_test
  fake_nvml_full fake_nvml_old fake_nvml_r535 fake_nvml_noinit)
fragscope_add_test(sources/nvidia_procfs_test.cc LIBS fragscope_sources)
# The agent socket (src/sources/agent): protocol, registry, server.
fragscope_add_test(sources/agent_protocol_test.cc LIBS fragscope_agent)
fragscope_add_test(sources/agent_server_test.cc LIBS fragscope_agent)
add_executable(agent_protocol_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/agent_protocol_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(agent_protocol_fuzz_replay PRIVATE fragscope_agent)
fragscope_set_warnings(agent_protocol_fuzz_replay)
add_test(NAME agent_protocol_fuzz_replay
  COMMAND agent_protocol_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/agent_protocol)
# Out-of-memory error text in logs (src/sources/oom_text), fixtures in tests/data/oom_text.
fragscope_add_test(sources/oom_text_scanner_test.cc LIBS fragscope_sources)
# TensorFlow / JAX allocator logs (src/sources/bfc_text), fixtures in tests/data/bfc_text.
fragscope_add_test(sources/bfc_log_test.cc LIBS fragscope_sources)
add_executable(bfc_log_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/bfc_log_fuzzer.cc ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(bfc_log_fuzz_replay PRIVATE fragscope_sources fragscope_analysis
  fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_set_warnings(bfc_log_fuzz_replay)
add_test(NAME bfc_log_fuzz_replay
  COMMAND bfc_log_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/bfc_log)
add_executable(oom_text_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/oom_text_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(oom_text_fuzz_replay PRIVATE fragscope_sources fragscope_sinks
  nlohmann_json::nlohmann_json)
fragscope_set_warnings(oom_text_fuzz_replay)
add_test(NAME oom_text_fuzz_replay
  COMMAND oom_text_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/oom_text)
