# Sink tests build AnalysisResult values by hand (tests/sinks/sample_results.h) and check how
# they are rendered; they never run the analyzer.
fragscope_add_test(sinks/layout_map_test.cc LIBS fragscope_sinks)
fragscope_add_test(sinks/text_report_test.cc LIBS fragscope_sinks GTest::gmock)
fragscope_add_test(sinks/json_report_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/perfetto_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
# Alerts: rules config, engine, hooks (exec hooks from tests/data/alerts, webhooks to a
# loopback server the test starts).
fragscope_add_test(sinks/alert_config_test.cc LIBS fragscope_sinks GTest::gmock)
fragscope_add_test(sinks/alert_engine_test.cc LIBS fragscope_sinks nlohmann_json::nlohmann_json)
fragscope_add_test(sinks/hook_runner_test.cc
  LIBS fragscope_sinks GTest::gmock nlohmann_json::nlohmann_json PkgConfig::CPP_HTTPLIB)
