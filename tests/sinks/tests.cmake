# Sink tests build AnalysisResult values by hand (tests/sinks/sample_results.h) and check how
# they are rendered; they never run the analyzer.
fragscope_add_test(sinks/layout_map_test.cc LIBS fragscope_sinks)
fragscope_add_test(sinks/text_report_test.cc LIBS fragscope_sinks GTest::gmock)
fragscope_add_test(sinks/json_report_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/perfetto_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
# The SQLite history: tests open real databases in temp dirs; the kill test SIGKILLs a writer.
fragscope_add_test(sinks/history_store_test.cc LIBS fragscope_sinks SQLite::SQLite3)
fragscope_add_test(sinks/history_kill_test.cc LIBS fragscope_sinks)
# The Prometheus exporter (src/sinks/prometheus).
fragscope_add_test(sinks/prometheus_exposition_test.cc LIBS fragscope_prometheus)
