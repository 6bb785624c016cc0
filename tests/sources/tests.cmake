# Stage 1, sources: the trace format (src/sources/trace).
fragscope_add_test(sources/input_stream_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/trace_reader_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/trace_writer_test.cc LIBS fragscope_sources)

# Snapshot input (src/sources/document, src/sources/pickle).
fragscope_add_test(sources/document_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/pickle_reader_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/json_document_test.cc LIBS fragscope_sources)
# PyTorch memory snapshots (src/sources/snapshot).
fragscope_add_test(sources/snapshot_decoder_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/document_json_test.cc LIBS fragscope_sources)
fragscope_add_test(sources/snapshot_reader_test.cc LIBS fragscope_sources fragscope_analysis)
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

# Out-of-memory error text in logs (src/sources/oom_text), fixtures in tests/data/oom_text.
fragscope_add_test(sources/oom_text_scanner_test.cc LIBS fragscope_sources)
add_executable(oom_text_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/oom_text_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(oom_text_fuzz_replay PRIVATE fragscope_sources fragscope_sinks
  nlohmann_json::nlohmann_json)
fragscope_set_warnings(oom_text_fuzz_replay)
add_test(NAME oom_text_fuzz_replay
  COMMAND oom_text_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/oom_text)
