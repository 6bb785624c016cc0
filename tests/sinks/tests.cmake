# Sink tests build AnalysisResult values by hand (tests/sinks/sample_results.h) and check how
# they are rendered; they never run the analyzer.
fragscope_add_test(sinks/layout_map_test.cc LIBS fragscope_sinks)
fragscope_add_test(sinks/text_report_test.cc LIBS fragscope_sinks GTest::gmock)
fragscope_add_test(sinks/json_report_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/perfetto_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
# The SQLite history: tests open real databases in temp dirs; the kill test SIGKILLs a writer.
fragscope_add_test(sinks/history_store_test.cc LIBS fragscope_sinks ${FRAGSCOPE_SQLITE})
fragscope_add_test(sinks/history_kill_test.cc LIBS fragscope_sinks)
# The Prometheus exporter (src/sinks/prometheus).
fragscope_add_test(sinks/prometheus_exposition_test.cc LIBS fragscope_prometheus)
# Alerts: rules config, engine, hooks (exec hooks from tests/data/alerts, webhooks to a
# loopback server the test starts).
fragscope_add_test(sinks/alert_config_test.cc LIBS fragscope_sinks GTest::gmock)
fragscope_add_test(sinks/alert_engine_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/hook_runner_test.cc
  LIBS fragscope_sinks GTest::gmock nlohmann_json::nlohmann_json PkgConfig::CPP_HTTPLIB)
# The alert_config fuzz target's corpus, replayed without libFuzzer.
add_executable(alert_config_fuzz_replay
  ${PROJECT_SOURCE_DIR}/fuzz/alert_config_fuzzer.cc
  ${PROJECT_SOURCE_DIR}/fuzz/replay_main.cc)
target_link_libraries(alert_config_fuzz_replay PRIVATE fragscope_sinks)
fragscope_set_warnings(alert_config_fuzz_replay)
add_test(NAME alert_config_fuzz_replay
  COMMAND alert_config_fuzz_replay ${PROJECT_SOURCE_DIR}/fuzz/corpus/alert_config)
fragscope_add_test(sinks/html_report_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/packed_ints_test.cc LIBS fragscope_sinks)
# The daemon's process API and `fragscope top`'s frames (src/sinks/live).
fragscope_add_test(sinks/process_api_test.cc LIBS fragscope_live nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/top_frame_test.cc LIBS fragscope_live)
# The daemon's API socket: the HTTP server on a Unix socket and the client `top --socket` uses.
fragscope_add_test(sinks/api_socket_test.cc LIBS fragscope_live)
