// The daemon's process API (src/sinks/live/process_api.h): rows from registry views, their
// JSON, the parser `fragscope top` reads them with, and what the parser says of hostile JSON.
#include "sinks/live/process_api.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fragscope::sinks::live {
namespace {

agent::AgentView View(std::uint32_t pid, const std::string& uuid) {
  agent::AgentView v;
  agent::AgentSample& s = v.entry.sample;
  s.pid = pid;
  s.rank = 3;
  s.job = "llama-70b";
  s.device_uuid = uuid;
  s.device_index = 1;
  s.step = 420;
  s.reserved_bytes = 80ull << 30;
  s.allocated_bytes = 60ull << 30;
  s.fragmentation_ratio = 0.25;
  s.cached_free_bytes = 20ull << 30;
  s.largest_free_block = 2ull << 20;
  s.largest_request_bytes = 3ull << 20;
  s.max_allocatable = 2ull << 20;
  s.free_block_count[21] = 5;
  s.free_block_bytes[21] = 11ull << 20;
  s.free_block_count[0] = 1;
  s.free_block_bytes[0] = 1;
  s.forecast_level = RiskLevel::kWarning;
  s.steps_to_oom = 37;
  s.oom_risk = {{50, 0.2}, {100, 0.45}, {500, 0.9}};
  s.oom_risk_explanation = "step demand came within one spread of the limit 3 times";
  v.entry.received_unix_ms = 1700000000123;
  v.recent = {{418, 80ull << 30, 58ull << 30}, {420, 80ull << 30, 60ull << 30}};
  return v;
}

TEST(ProcessApiTest, RowsCarryWhatTheSampleAndTheForecastSay) {
  const ProcessRow r = MakeProcessRow(View(4242, "GPU-aa"), "node-7");
  EXPECT_EQ(r.id, ProcessId(4242, "GPU-aa"));
  EXPECT_EQ(r.id.rfind("4242-", 0), 0u);
  EXPECT_NE(r.id, ProcessId(4242, "GPU-ab"));
  EXPECT_EQ(r.host, "node-7");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.oom_risk, 0.45);  // the 100-step horizon
  EXPECT_EQ(r.oom_risk_explanation, "step demand came within one spread of the limit 3 times");
  EXPECT_EQ(r.largest_request_bytes, 3ull << 20);
  ASSERT_EQ(r.history.size(), 2u);
  EXPECT_EQ(r.history[1].allocated_bytes, 60ull << 30);
  ASSERT_EQ(r.free_blocks.size(), 2u);
  EXPECT_EQ(r.free_blocks[0].min_bytes, 0u);
  EXPECT_EQ(r.free_blocks[1].min_bytes, 2ull << 20);
  EXPECT_EQ(r.free_blocks[1].count, 5u);
  // Unknown stays unknown: no risk horizon, no request, no forecast.
  agent::AgentView bare;
  bare.entry.sample.pid = 1;
  const ProcessRow b = MakeProcessRow(bare, "h");
  EXPECT_FALSE(b.oom_risk);
  EXPECT_FALSE(b.largest_request_bytes);
  EXPECT_FALSE(b.fragmentation_ratio);
  EXPECT_EQ(b.level, RiskLevel::kUnknown);
}

TEST(ProcessApiTest, TheListAndTheMapReadBackAsWritten) {
  ProcessList list;
  list.host = "node-7";
  list.time_unix_ms = 1700000000999;
  list.processes.push_back(MakeProcessRow(View(4242, "GPU-aa"), "node-7"));
  agent::AgentView other = View(17, "GPU-bb");
  other.entry.sample.rank = -1;
  other.entry.sample.fragmentation_ratio.reset();
  other.entry.sample.steps_to_oom.reset();
  other.entry.sample.oom_risk.clear();
  other.entry.closed = agent::Clock::now();
  list.processes.push_back(MakeProcessRow(other, "node-7"));
  for (ProcessRow& r : list.processes) r.free_blocks.clear();

  const std::string text = RenderProcessesJson(list);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["schema"], "fragscope.processes");
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["processes"][0]["oom_risk_horizon_steps"], 100);
  EXPECT_TRUE(j["processes"][1]["rank"].is_null());
  EXPECT_TRUE(j["processes"][1]["oom_risk"].is_null());
  EXPECT_EQ(j["processes"][1]["oom_risk_explanation"], "");  // no risk, nothing to explain
  EXPECT_FALSE(j["processes"][0].contains("free_blocks"));

  Result<ProcessList> back = ParseProcessesJson(text);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->processes.size(), 2u);
  EXPECT_EQ(back->host, "node-7");
  EXPECT_EQ(back->time_unix_ms, 1700000000999);
  const ProcessRow& a = back->processes[0];
  const ProcessRow& want = list.processes[0];
  EXPECT_EQ(a.id, want.id);
  EXPECT_EQ(a.job, want.job);
  EXPECT_EQ(a.pid, want.pid);
  EXPECT_EQ(a.device_index, 1);
  EXPECT_EQ(a.reserved_bytes, want.reserved_bytes);
  EXPECT_EQ(a.fragmentation_ratio, 0.25);
  EXPECT_EQ(a.largest_free_block_bytes, want.largest_free_block_bytes);
  EXPECT_EQ(a.oom_risk, 0.45);
  EXPECT_EQ(a.oom_risk_explanation, want.oom_risk_explanation);
  EXPECT_EQ(a.level, RiskLevel::kWarning);
  EXPECT_EQ(a.steps_to_oom, 37);
  EXPECT_TRUE(a.connected);
  ASSERT_EQ(a.history.size(), 2u);
  EXPECT_EQ(a.history[0].step, 418);
  const ProcessRow& b = back->processes[1];
  EXPECT_EQ(b.rank, -1);
  EXPECT_FALSE(b.fragmentation_ratio);
  EXPECT_FALSE(b.steps_to_oom);
  EXPECT_FALSE(b.connected);

  const ProcessRow with_map = MakeProcessRow(View(4242, "GPU-aa"), "node-7");
  Result<ProcessRow> map = ParseProcessMapJson(RenderProcessMapJson(list, with_map));
  ASSERT_TRUE(map.ok()) << map.status().message();
  ASSERT_EQ(map->free_blocks.size(), 2u);
  EXPECT_EQ(map->free_blocks[1].bytes, 11ull << 20);
}

TEST(ProcessApiTest, AnswersTheListAMapAnd404) {
  const std::vector<agent::AgentView> views = {View(4242, "GPU-aa"), View(17, "GPU-bb")};
  const auto list = AnswerProcessApi("/api/v1/processes", views, "node-7", 5);
  EXPECT_EQ(list.status, 200);
  Result<ProcessList> parsed = ParseProcessesJson(list.body);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->processes.size(), 2u);
  const std::string id = ProcessId(17, "GPU-bb");
  const auto map = AnswerProcessApi("/api/v1/processes/" + id + "/map", views, "node-7", 5);
  EXPECT_EQ(map.status, 200);
  Result<ProcessRow> row = ParseProcessMapJson(map.body);
  ASSERT_TRUE(row.ok()) << row.status().message();
  EXPECT_EQ(row->pid, 17u);
  for (const char* target : {"/api/v1/processes/nope/map", "/api/v2/processes", "/api/",
                             "/api/v1/processes//map", "/api/v1/processes/17/"}) {
    const auto answer = AnswerProcessApi(target, views, "node-7", 5);
    EXPECT_EQ(answer.status, 404) << target;
    EXPECT_TRUE(nlohmann::json::parse(answer.body).contains("error")) << target;
  }
}

// A valid answer with one field of the first row replaced.
std::string WithField(const std::string& field, const nlohmann::json& value) {
  ProcessList list;
  list.host = "h";
  list.processes.push_back(MakeProcessRow(View(4242, "GPU-aa"), "h"));
  nlohmann::json j = nlohmann::json::parse(RenderProcessesJson(list));
  if (value.is_discarded()) {
    j["processes"][0].erase(field);
  } else {
    j["processes"][0][field] = value;
  }
  return j.dump();
}

TEST(ProcessApiTest, HostileAnswersAreRefusedWithTheField) {
  struct Case {
    std::string text;
    std::string error;  // a part of the message
  };
  const nlohmann::json gone(nlohmann::json::value_t::discarded);
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  const Case cases[] = {
      {"", "not JSON (byte 1)"},
      {"{\"schema\": \"fragscope.processes\", ", "not JSON"},
      {"[1, 2]", "expected a JSON object at the top, got array"},
      {deep, "nested deeper"},
      {"{\"schema\": \"prometheus\", \"schema_version\": 1}", "schema: \"prometheus\" is not"},
      {"{\"schema\": \"fragscope.processes\", \"schema_version\": 2, \"host\": \"h\"}",
       "schema_version: this fragscope reads version 1"},
      {"{\"schema\": \"fragscope.processes\", \"schema_version\": 1, \"host\": \"h\", "
       "\"time_unix_ms\": 1}",
       "processes: missing"},
      {"{\"schema\": \"fragscope.processes\", \"schema_version\": 1, \"host\": \"h\", "
       "\"time_unix_ms\": 1, \"processes\": {}}",
       "processes: expected an array, got object"},
      {"{\"schema\": \"fragscope.processes\", \"schema_version\": 1, \"host\": \"h\", "
       "\"time_unix_ms\": 1, \"processes\": [7]}",
       "processes[0]: expected an object, got number"},
      {WithField("reserved_bytes", -5),
       "processes[0].reserved_bytes: expected an unsigned integer"},
      {WithField("reserved_bytes", 1.5), "processes[0].reserved_bytes: expected an unsigned"},
      {WithField("reserved_bytes", "8G"),
       "processes[0].reserved_bytes: expected an unsigned integer, got string"},
      {WithField("allocated_bytes", gone), "processes[0].allocated_bytes: missing"},
      {WithField("pid", 1ull << 40), "processes[0].pid: expected a process id"},
      {WithField("rank", 1ull << 40), "processes[0].rank"},
      {WithField("fragmentation_ratio", 7),
       "processes[0].fragmentation_ratio: 7 is outside [0, 1]"},
      {WithField("oom_risk", "high"), "processes[0].oom_risk: expected a number or null"},
      {WithField("level", "doom"), "processes[0].level: expected one of"},
      {WithField("steps_to_oom", -1), "processes[0].steps_to_oom: -1 is outside"},
      {WithField("connected", 1), "processes[0].connected: expected true or false"},
      {WithField("job", std::string(5000, 'x')), "processes[0].job: 5000 bytes"},
      {WithField("history", nlohmann::json::array()), "processes[0].history: expected an object"},
      {WithField("history", {{"step", {1, 2}}, {"reserved_bytes", {1}}, {"allocated_bytes", {1}}}),
       "differ in length"},
      {WithField("history", {{"step", std::vector<int>(61, 1)},
                             {"reserved_bytes", std::vector<int>(61, 1)},
                             {"allocated_bytes", std::vector<int>(61, 1)}}),
       "processes[0].history.step: 61 points, above the limit 60"},
      {WithField("history", {{"step", {1}}, {"reserved_bytes", {"x"}}, {"allocated_bytes", {1}}}),
       "processes[0].history.reserved_bytes[0]: expected an unsigned integer"},
  };
  for (const Case& c : cases) {
    Result<ProcessList> got = ParseProcessesJson(c.text);
    ASSERT_FALSE(got.ok()) << c.text.substr(0, 200);
    EXPECT_NE(got.status().message().find(c.error), std::string::npos)
        << "got: " << got.status().message() << "\nwanted: " << c.error;
  }
  // A map without its free blocks, or with too many.
  ProcessList list;
  nlohmann::json map =
      nlohmann::json::parse(RenderProcessMapJson(list, MakeProcessRow(View(1, "GPU-aa"), "h")));
  map["process"]["free_blocks"] = nlohmann::json::array();
  for (int i = 0; i < 65; ++i)
    map["process"]["free_blocks"].push_back({{"min_bytes", 1}, {"count", 1}, {"bytes", 1}});
  Result<ProcessRow> got = ParseProcessMapJson(map.dump());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("process.free_blocks: 65 buckets"), std::string::npos)
      << got.status().message();
  map["process"].erase("free_blocks");
  got = ParseProcessMapJson(map.dump());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("process.free_blocks: missing"), std::string::npos);
}

}  // namespace
}  // namespace fragscope::sinks::live
