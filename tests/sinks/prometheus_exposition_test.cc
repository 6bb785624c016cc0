#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "sinks/prometheus/exposition.h"
#include "sinks/prometheus/textfile.h"

namespace fragscope::sinks::prometheus {
namespace {

NodeState TestState() {
  NodeState state;
  state.hostname = "node-7";
  gpu::GpuInfo g;
  g.uuid = "GPU-aaaa";
  g.index = 3;
  g.pci_bus_id = "00000000:3B:00.0";
  g.name = "NVIDIA A100-SXM4-80GB";
  g.device_minor = 3;
  g.memory_total_bytes = 85899345920ull;
  g.memory_used_bytes = 1024;
  g.processes.push_back({4242, 4096, std::nullopt, std::nullopt});
  g.processes.push_back({4243, std::nullopt, std::nullopt, std::nullopt});
  state.gpus.gpus.push_back(g);
  state.gpus.driver_version = "535.104.05";
  agent::AgentEntry e;
  e.sample.pid = 4242;
  e.sample.rank = 1;
  e.sample.job = "job \"x\"\\y\nz";
  e.sample.device_uuid = "GPU-aaaa";
  e.sample.step = 99;
  e.sample.reserved_bytes = 8ull << 30;
  e.sample.largest_free_block = 123456789;
  e.sample.fragmentation_ratio = 0.5;
  e.sample.free_block_count[20] = 4;
  e.sample.free_block_bytes[20] = 5ull << 20;
  e.sample.free_block_count[2] = 1;  // outside the always-shown range, non-empty
  e.sample.free_block_bytes[2] = 5;
  e.sample.forecast_level = RiskLevel::kWarning;
  e.sample.steps_to_oom = 12;
  e.received_unix_ms = 1700000000123;
  e.samples = 31;
  state.agents.push_back(e);
  agent::AgentEntry unknown_gpu = e;
  unknown_gpu.sample.pid = 5;
  unknown_gpu.sample.rank = -1;
  unknown_gpu.sample.job = "";
  unknown_gpu.sample.device_uuid = "GPU-not-on-this-node";
  unknown_gpu.sample.steps_to_oom.reset();
  state.agents.push_back(unknown_gpu);
  state.daemon.version = "9.9";
  state.daemon.agents.samples_received = 77;
  state.daemon.agents.rejected[static_cast<std::size_t>(agent::RejectReason::kRateLimited)] = 3;
  state.daemon.history_samples_dropped = 12;
  return state;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool Has(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) {
    if (l == line) return true;
  }
  return false;
}

// A sample line of the text exposition format: a metric name, optional {name="value",...}
// labels (values escape only \\, \" and \n), one space, a number. Returns the metric name, or
// nothing when the line does not parse. (A scanner, not std::regex: GCC 12 reports a
// maybe-uninitialized inside <regex> when it is built with the sanitizers at -O1.)
std::optional<std::string> SampleName(const std::string& line) {
  auto name_char = [](char c, bool first) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
           (!first && std::isdigit(static_cast<unsigned char>(c)));
  };
  size_t i = 0;
  while (i < line.size() && name_char(line[i], i == 0)) ++i;
  if (i == 0) return std::nullopt;
  std::string name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t label = i;
      while (i < line.size() && name_char(line[i], i == label) && line[i] != ':') ++i;
      if (i == label || line.compare(i, 2, "=\"") != 0) return std::nullopt;
      i += 2;
      for (; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\n') return std::nullopt;
        if (line[i] == '\\') {
          if (++i == line.size() || std::string_view("\"\\n").find(line[i]) == std::string::npos) {
            return std::nullopt;
          }
        }
      }
      if (i == line.size()) return std::nullopt;
      ++i;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i == line.size()) return std::nullopt;
    ++i;  // closing brace
  }
  if (i == line.size() || line[i] != ' ') return std::nullopt;
  const std::string value = line.substr(i + 1);
  if (value == "NaN" || value == "+Inf" || value == "-Inf") return name;
  if (value.empty() || value.find_first_not_of("0123456789.e+-") != std::string::npos) {
    return std::nullopt;
  }
  return name;
}

TEST(ExpositionTest, TheSampleScannerRejectsMalformedLines) {
  EXPECT_EQ(SampleName("a_b:c 1"), "a_b:c");
  EXPECT_EQ(SampleName(R"(m{a="x\"y",b="\n"} -1.5e+3)"), "m");
  EXPECT_EQ(SampleName("m{a=\"x\",} +Inf"), "m");
  EXPECT_FALSE(SampleName("1m 1"));
  EXPECT_FALSE(SampleName("m  1"));
  EXPECT_FALSE(SampleName("m 1x"));
  EXPECT_FALSE(SampleName(R"(m{a="x} 1)"));
  EXPECT_FALSE(SampleName(R"(m{a="\t"} 1)"));
  EXPECT_FALSE(SampleName(R"(m{1a="x"} 1)"));
  EXPECT_FALSE(SampleName(R"(m{a=x} 1)"));
}

TEST(ExpositionTest, EverySampleLineIsWellFormedAndFamiliesAreContiguous) {
  const std::string text = RenderExposition(TestState());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  std::set<std::string> seen_families;
  std::string current;
  for (const std::string& line : Lines(text)) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream in(line.substr(7));
      std::string name, type;
      in >> name >> type;
      EXPECT_TRUE(type == "gauge" || type == "counter") << line;
      EXPECT_EQ(name.rfind("fragscope_", 0), 0u) << line;
      if (type == "counter") {
        EXPECT_EQ(name.substr(name.size() - 6), "_total") << line;
      }
      EXPECT_TRUE(seen_families.insert(name).second) << "family twice: " << name;
      current = name;
      continue;
    }
    const std::optional<std::string> name = SampleName(line);
    ASSERT_TRUE(name.has_value()) << line;
    EXPECT_EQ(*name, current) << "sample outside its family: " << line;
  }
}

TEST(ExpositionTest, ProcessSeriesCarryDcgmLabelsAndEscapedValues) {
  const std::string text = RenderExposition(TestState());
  const std::string labels =
      R"(gpu="3",UUID="GPU-aaaa",pci_bus_id="00000000:3B:00.0",device="nvidia3",)"
      R"(modelName="NVIDIA A100-SXM4-80GB",Hostname="node-7",pid="4242",rank="1",)"
      R"(job_name="job \"x\"\\y\nz")";
  EXPECT_TRUE(Has(text, "fragscope_process_reserved_bytes{" + labels + "} 8589934592")) << text;
  EXPECT_TRUE(Has(text, "fragscope_process_largest_free_block_bytes{" + labels + "} 123456789"));
  EXPECT_TRUE(Has(text, "fragscope_process_fragmentation_ratio{" + labels + "} 0.5"));
  EXPECT_TRUE(Has(text, "fragscope_process_forecast_level{" + labels + "} 3"));
  EXPECT_TRUE(Has(text, "fragscope_process_steps_to_oom{" + labels + "} 12"));
  EXPECT_TRUE(Has(text, "fragscope_process_step{" + labels + "} 99"));
  EXPECT_TRUE(Has(text, "fragscope_process_samples_total{" + labels + "} 31"));
  EXPECT_TRUE(
      Has(text, "fragscope_process_last_sample_timestamp_seconds{" + labels + "} 1700000000.123"));
  EXPECT_TRUE(Has(text, "fragscope_process_free_blocks{" + labels +
                            R"(,size_bucket="1MiB-2MiB",size_min_bytes="1048576"} 4)"));
  EXPECT_TRUE(Has(text, "fragscope_process_free_block_bytes{" + labels +
                            R"(,size_bucket="1MiB-2MiB",size_min_bytes="1048576"} 5242880)"));
  // Only buckets that hold blocks are shown, wherever they are.
  EXPECT_EQ(text.find(R"(size_bucket="512B-1KiB")"), std::string::npos);
  EXPECT_TRUE(Has(text, "fragscope_process_free_blocks{" + labels +
                            R"(,size_bucket="4B-8B",size_min_bytes="4"} 1)"));
  EXPECT_EQ(text.find(R"(size_bucket="2B-4B")"), std::string::npos);
  // A sample for a GPU the node does not report: no join labels, no rank/job (empty labels
  // are left out); no
  // steps_to_oom series when the forecast expects none.
  const std::string other = R"(UUID="GPU-not-on-this-node",Hostname="node-7",pid="5")";
  EXPECT_TRUE(Has(text, "fragscope_process_reserved_bytes{" + other + "} 8589934592"));
  EXPECT_EQ(text.find("fragscope_process_steps_to_oom{" + other), std::string::npos);
}

TEST(ExpositionTest, UnknownSummaryFiguresAreLeftOutNotZero) {
  // The sample of State() sends largest_free_block and fragmentation_ratio only: the other
  // summary figures are unknown and have no series (a 0 would read as "no fragmentation").
  NodeState state = TestState();
  state.agents.resize(1);
  const std::string text = RenderExposition(state);
  EXPECT_EQ(text.find("fragscope_process_cached_free_bytes{"), std::string::npos) << text;
  EXPECT_EQ(text.find("fragscope_process_max_allocatable_bytes{"), std::string::npos);
  EXPECT_EQ(text.find("fragscope_process_stranded_bytes{"), std::string::npos);
  EXPECT_NE(text.find("fragscope_process_largest_free_block_bytes{"), std::string::npos);
  state.agents[0].sample.fragmentation_ratio.reset();
  EXPECT_EQ(RenderExposition(state).find("fragscope_process_fragmentation_ratio{"),
            std::string::npos);
}

TEST(ExpositionTest, GpuAndDaemonSeries) {
  const std::string text = RenderExposition(TestState());
  const std::string gpu =
      R"(gpu="3",UUID="GPU-aaaa",pci_bus_id="00000000:3B:00.0",device="nvidia3",)"
      R"(modelName="NVIDIA A100-SXM4-80GB",Hostname="node-7")";
  EXPECT_TRUE(Has(text, "fragscope_gpu_memory_total_bytes{" + gpu + "} 85899345920"));
  EXPECT_TRUE(Has(text, "fragscope_gpu_process_memory_used_bytes{" + gpu + R"(,pid="4242"} 4096)"));
  EXPECT_EQ(text.find(R"(pid="4243"} )"), std::string::npos);  // NVML: not available
  EXPECT_EQ(text.find("fragscope_gpu_memory_reserved_bytes{"), std::string::npos);
  EXPECT_TRUE(Has(text, R"(fragscope_nvml_available{Hostname="node-7"} 1)"));
  EXPECT_TRUE(Has(text, R"(fragscope_agent_samples_received_total{Hostname="node-7"} 77)"));
  EXPECT_TRUE(
      Has(text,
          R"(fragscope_agent_samples_rejected_total{reason="rate_limited",Hostname="node-7"} 3)"));
  EXPECT_TRUE(Has(text, R"(fragscope_agent_series{Hostname="node-7"} 2)"));
  EXPECT_TRUE(Has(text, R"(fragscope_build_info{version="9.9",Hostname="node-7"} 1)"));
  EXPECT_TRUE(Has(text, R"(fragscope_history_samples_dropped_total{Hostname="node-7"} 12)"));
}

TEST(ExpositionTest, NoGpusIsAStateNotAnError) {
  NodeState state;
  state.hostname = "h";
  state.gpus.nvml_unavailable_reason = "libnvidia-ml.so.1: cannot open shared object file";
  const std::string text = RenderExposition(state);
  EXPECT_TRUE(Has(
      text,
      R"(fragscope_nvml_available{reason="libnvidia-ml.so.1: cannot open shared object file",Hostname="h"} 0)"));
  EXPECT_TRUE(Has(text, R"(fragscope_gpus{Hostname="h"} 0)"));
  // Daemon counters are present at 0, not missing, before anything happened.
  EXPECT_TRUE(Has(text, R"(fragscope_history_samples_dropped_total{Hostname="h"} 0)"));
}

TEST(ExpositionTest, SizeBucketLabels) {
  EXPECT_EQ(SizeBucketLabel(0), "0B-2B");
  EXPECT_EQ(SizeBucketLabel(1), "2B-4B");
  EXPECT_EQ(SizeBucketLabel(9), "512B-1KiB");
  EXPECT_EQ(SizeBucketLabel(20), "1MiB-2MiB");
  EXPECT_EQ(SizeBucketLabel(39), "512GiB-1TiB");
  EXPECT_EQ(SizeBucketLabel(63), "8EiB-16EiB");
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(TextfileTest, ReplacesTheFileAtomicallyAndReportsErrors) {
  char tmpl[] = "/tmp/fragscope_textfile_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_TRUE(WriteTextfile(dir, "a 1\n").ok());
  ASSERT_TRUE(WriteTextfile(dir, "b 2\n").ok());
  std::ifstream in(dir + "/fragscope.prom");
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), "b 2\n");
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1u);  // no temporary file left behind
  Status missing = WriteTextfile(dir + "/nope", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(dir + "/nope"), std::string::npos) << missing.message();
  std::filesystem::remove_all(dir);
}

// Issue 24 item 4: fragscope.prom is a name the daemon chose, so a link planted there is
// refused and what it points to is neither written nor created.
TEST(TextfileTest, Issue24ALinkAtTheTextfileIsRefused) {
  char tmpl[] = "/tmp/fragscope_textfile_test_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::filesystem::create_symlink(dir + "/victim", dir + "/fragscope.prom");
  Status s = WriteTextfile(dir, "a 1\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is a symbolic link"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/victim"));
  EXPECT_TRUE(std::filesystem::is_symlink(dir + "/fragscope.prom"));
  std::filesystem::remove_all(dir);
}

// The daemon's OOM risk: one series per horizon, labelled horizon_steps; none when unknown.
TEST(ExpositionTest, OomRiskIsAGaugePerHorizon) {
  NodeState state = TestState();
  state.agents[0].sample.oom_risk = {{50, 0.01}, {100, 0.125}, {500, 0.5}};
  const std::string text = RenderExposition(state);
  EXPECT_TRUE(Has(text, "# TYPE fragscope_process_oom_risk gauge")) << text;
  const std::size_t at = text.find("fragscope_process_oom_risk{gpu=\"3\"");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(line.find(",horizon_steps=\"50\"} 0.01"), std::string::npos) << line;
  EXPECT_TRUE(text.find(R"(horizon_steps="100"} 0.125)") != std::string::npos) << text;
  EXPECT_EQ(text.find(R"(pid="5",horizon_steps)"), std::string::npos);  // no risk: no series
}

// Where the risk comes from (issue 31 item 5): the limit it takes and the largest step seen,
// per process, so a dashboard or an alert can show how close the job came.
TEST(ExpositionTest, TheRisksLimitAndLargestStepAreGauges) {
  NodeState state = TestState();
  state.agents[0].sample.oom_risk = {{100, 0.125}};
  state.agents[0].sample.oom_risk_limit_bytes = 3.5e9;
  state.agents[0].sample.oom_risk_largest_step_bytes = 2.75e9;
  const std::string text = RenderExposition(state);
  EXPECT_TRUE(Has(text, "# TYPE fragscope_process_oom_risk_limit_bytes gauge")) << text;
  const std::size_t at = text.find("fragscope_process_oom_risk_limit_bytes{");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  EXPECT_NE(line.find("} 3500000000"), std::string::npos) << line;
  EXPECT_NE(text.find("} 2750000000"), std::string::npos) << text;
  // One series each: the process without a risk has none.
  EXPECT_EQ(text.find("fragscope_process_oom_risk_largest_step_bytes{"),
            text.rfind("fragscope_process_oom_risk_largest_step_bytes{"));
}

}  // namespace
}  // namespace fragscope::sinks::prometheus
