#include "sinks/history/history_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "testing/test_util.h"

namespace fragscope::sinks {
namespace {

using analysis::RunSummary;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

RunSummary Summary(std::string run, std::string arch, std::int64_t when) {
  RunSummary r;
  r.run = std::move(run);
  r.architecture = std::move(arch);
  r.recorded_unix_s = when;
  r.source = "trace.jsonl";
  r.device = 1;
  r.steps = 120;
  r.peak_allocated_bytes = 5ull << 30;
  r.peak_reserved_bytes = 6ull << 30;
  r.request_count = 99;
  r.request_p50_bytes = 512;
  r.request_p90_bytes = 2 << 20;
  r.request_p99_bytes = 20 << 20;
  r.request_max_bytes = ~std::uint64_t{0};  // survives the signed column
  r.marks = {{10, 0.125}, {100, 0.25}};
  r.fragmentation_growth_per_1000_steps = 0.75;
  r.num_ooms = 3;
  return r;
}

std::unique_ptr<HistoryStore> OpenOrDie(const std::string& path, HistoryOptions o = {}) {
  Result<std::unique_ptr<HistoryStore>> s = HistoryStore::Open(path, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(HistoryStoreTest, CreatesDirectoriesWithMode0700AndReopens) {
  const std::string dir = testing::MakeTempDir() + "/state/fragscope";
  const std::string path = dir + "/history.sqlite";
  {
    auto store = OpenOrDie(path);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->RecordRun(Summary("r1", "gpt", 100)).ok());
  }
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto store = OpenOrDie(path);
  ASSERT_TRUE(store);
  Result<std::vector<RunSummary>> runs = store->ListRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  const RunSummary& r = runs->front();
  const RunSummary want = Summary("r1", "gpt", 100);
  EXPECT_EQ(r.run, want.run);
  EXPECT_EQ(r.architecture, want.architecture);
  EXPECT_EQ(r.recorded_unix_s, 100);
  EXPECT_EQ(r.source, want.source);
  EXPECT_EQ(r.device, 1);
  EXPECT_EQ(r.steps, 120u);
  EXPECT_EQ(r.peak_allocated_bytes, want.peak_allocated_bytes);
  EXPECT_EQ(r.peak_reserved_bytes, want.peak_reserved_bytes);
  EXPECT_EQ(r.request_count, 99u);
  EXPECT_EQ(r.request_p50_bytes, 512u);
  EXPECT_EQ(r.request_p90_bytes, want.request_p90_bytes);
  EXPECT_EQ(r.request_p99_bytes, want.request_p99_bytes);
  EXPECT_EQ(r.request_max_bytes, ~std::uint64_t{0});
  ASSERT_EQ(r.marks.size(), 2u);
  EXPECT_EQ(r.marks[1].step, 100);
  EXPECT_DOUBLE_EQ(r.marks[1].fragmentation_ratio, 0.25);
  EXPECT_EQ(r.fragmentation_growth_per_1000_steps, 0.75);
  EXPECT_EQ(r.num_ooms, 3u);
}

TEST(HistoryStoreTest, MissingFileWithoutCreateIsNotFound) {
  const std::string path = testing::MakeTempDir() + "/none.sqlite";
  HistoryOptions o;
  o.create_if_missing = false;
  Result<std::unique_ptr<HistoryStore>> s = HistoryStore::Open(path, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(HistoryStoreTest, ListFilterOrderLimitFindDelete) {
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite");
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->RecordRun(Summary("a1", "gpt", 10)).ok());
  ASSERT_TRUE(store->RecordRun(Summary("b1", "cnn", 20)).ok());
  ASSERT_TRUE(store->RecordRun(Summary("a2", "gpt", 30)).ok());
  ASSERT_TRUE(store->RecordRun(Summary("a3", "gpt", 30)).ok());  // same time: later insert first

  Result<std::vector<RunSummary>> all = store->ListRuns();
  ASSERT_TRUE(all.ok());
  std::vector<std::string> names;
  for (const RunSummary& r : *all) names.push_back(r.run);
  EXPECT_EQ(names, (std::vector<std::string>{"a3", "a2", "b1", "a1"}));

  Result<std::vector<RunSummary>> last = store->LastRuns("gpt", 2);
  ASSERT_TRUE(last.ok());
  ASSERT_EQ(last->size(), 2u);
  EXPECT_EQ((*last)[0].run, "a3");
  EXPECT_EQ((*last)[1].run, "a2");
  EXPECT_TRUE(store->LastRuns("gpt", 0)->empty());
  EXPECT_TRUE(store->LastRuns("nothing", 5)->empty());

  Result<std::optional<RunSummary>> b1 = store->FindRun("b1");
  ASSERT_TRUE(b1.ok());
  ASSERT_TRUE(b1->has_value());
  EXPECT_EQ((*b1)->architecture, "cnn");
  EXPECT_FALSE(store->FindRun("zz")->has_value());

  // A name is unique; replace swaps the row and its marks.
  Status dup = store->RecordRun(Summary("a1", "gpt", 40));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("already recorded"), std::string::npos);
  RunSummary changed = Summary("a1", "gpt", 40);
  changed.marks = {{10, 0.5}};
  ASSERT_TRUE(store->RecordRun(changed, /*replace=*/true).ok());
  Result<std::optional<RunSummary>> a1 = store->FindRun("a1");
  ASSERT_TRUE(a1->has_value());
  ASSERT_EQ((*a1)->marks.size(), 1u);
  EXPECT_EQ((*a1)->recorded_unix_s, 40);

  Result<bool> deleted = store->DeleteRun("a1");
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  EXPECT_FALSE(*store->DeleteRun("a1"));
  EXPECT_EQ(store->ListRuns()->size(), 3u);
  EXPECT_TRUE(store->IntegrityCheck().ok());
}

TEST(HistoryStoreTest, RecordRunNeedsNameAndArchitecture) {
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite");
  EXPECT_EQ(store->RecordRun(Summary("", "gpt", 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->RecordRun(Summary("r", "", 1)).code(), StatusCode::kInvalidArgument);
}

TEST(HistoryStoreTest, ValuesAreBoundNotInterpolated) {
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite");
  const std::string evil = "x'); DROP TABLE runs; --";
  ASSERT_TRUE(store->RecordRun(Summary(evil, evil, 1)).ok());
  Result<std::vector<RunSummary>> runs = store->LastRuns(evil, 3);
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ(runs->front().run, evil);
}

// ---- Refusing what is not ours, byte for byte untouched ----

void ExpectRefused(const std::string& path, const std::string& what) {
  const std::string before = Slurp(path);
  Result<std::unique_ptr<HistoryStore>> s = HistoryStore::Open(path);
  ASSERT_FALSE(s.ok()) << what;
  SCOPED_TRACE(s.status().ToString());
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption) << s.status().ToString();
  EXPECT_EQ(s.status().message().rfind(path + ": ", 0), 0u) << s.status().message();
  EXPECT_NE(s.status().message().find(what), std::string::npos) << s.status().message();
  EXPECT_EQ(Slurp(path), before) << "the file was modified";
  EXPECT_FALSE(std::filesystem::exists(path + "-journal"));
}

TEST(HistoryStoreTest, GarbageFileIsRefused) {
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  WriteFile(path, std::string(5000, 'g'));
  ExpectRefused(path, "not a SQLite database");
  WriteFile(path, "short");
  ExpectRefused(path, "shorter than a SQLite header");
}

// Issue 24 item 4: a link at the history path, or at a file SQLite keeps beside it, is refused;
// a link to nothing never gets its target created.
TEST(HistoryStoreTest, Issue24LinksAreRefusedAndTheirTargetsNeverCreated) {
  const std::string dir = testing::MakeTempDir();
  std::filesystem::create_symlink(dir + "/target.sqlite", dir + "/dangling.sqlite");
  Result<std::unique_ptr<HistoryStore>> dangling = HistoryStore::Open(dir + "/dangling.sqlite");
  ASSERT_FALSE(dangling.ok());
  EXPECT_EQ(dangling.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dangling.status().message().find("is a symbolic link"), std::string::npos)
      << dangling.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/target.sqlite"));

  {  // the store closes at the end of this scope
    OpenOrDie(dir + "/real.sqlite");
  }
  const std::string before = Slurp(dir + "/real.sqlite");
  std::filesystem::create_symlink(dir + "/real.sqlite", dir + "/link.sqlite");
  EXPECT_FALSE(HistoryStore::Open(dir + "/link.sqlite").ok());
  // A planted -wal link would be written through by SQLite's own open.
  std::filesystem::create_symlink(dir + "/victim", dir + "/real.sqlite-wal");
  Result<std::unique_ptr<HistoryStore>> wal = HistoryStore::Open(dir + "/real.sqlite");
  ASSERT_FALSE(wal.ok());
  EXPECT_NE(wal.status().message().find("real.sqlite-wal: is a symbolic link"), std::string::npos)
      << wal.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/victim"));
  EXPECT_EQ(Slurp(dir + "/real.sqlite"), before);
  std::filesystem::remove_all(dir);
}

TEST(HistoryStoreTest, AnotherApplicationsDatabaseIsRefused) {
  const std::string path = testing::MakeTempDir() + "/other.sqlite";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE notes(t TEXT); INSERT INTO notes VALUES ('mine');",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  ExpectRefused(path, "another application");
}

TEST(HistoryStoreTest, NewerSchemaIsRefused) {
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  {  // the store closes at the end of this scope
    ASSERT_TRUE(OpenOrDie(path));
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE schema_version SET version = 99", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  ExpectRefused(path, "schema version 99 is newer");
}

TEST(HistoryStoreTest, TruncatedDatabaseIsRefused) {
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  {
    auto store = OpenOrDie(path);
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE(store->RecordRun(Summary("run" + std::to_string(i), "gpt", i)).ok());
    }
  }  // the last close checkpoints the WAL into the main file
  ASSERT_FALSE(std::filesystem::exists(path + "-wal"));
  const std::string full = Slurp(path);
  ASSERT_GT(full.size(), 16384u);
  WriteFile(path, full.substr(0, full.size() / 2));
  ExpectRefused(path, "damaged");
}

TEST(HistoryStoreTest, EmptyFileBecomesAHistory) {
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  WriteFile(path, "");
  auto store = OpenOrDie(path);
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->RecordRun(Summary("r", "gpt", 1)).ok());
}

TEST(HistoryStoreTest, DefaultPathFollowsXdg) {
  const char* old_state = std::getenv("XDG_STATE_HOME");
  const char* old_home = std::getenv("HOME");
  const std::string saved_state = old_state ? old_state : "";
  const std::string saved_home = old_home ? old_home : "";
  setenv("XDG_STATE_HOME", "/xdg/state", 1);
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(*DefaultHistoryPath(), "/xdg/state/fragscope/history.sqlite");
  setenv("XDG_STATE_HOME", "relative/ignored", 1);
  EXPECT_EQ(*DefaultHistoryPath(), "/home/u/.local/state/fragscope/history.sqlite");
  unsetenv("XDG_STATE_HOME");
  EXPECT_EQ(*DefaultHistoryPath(), "/home/u/.local/state/fragscope/history.sqlite");
  unsetenv("HOME");
  EXPECT_EQ(DefaultHistoryPath().status().code(), StatusCode::kInvalidArgument);
  if (old_state) setenv("XDG_STATE_HOME", saved_state.c_str(), 1);
  if (old_home) setenv("HOME", saved_home.c_str(), 1);
}

// ---- Agent samples ----

agent::AgentSample Sample(const std::string& run, std::int64_t step) {
  agent::AgentSample a;
  a.pid = 4242;
  a.rank = 3;
  a.job = "job-7";
  a.run = run;
  a.architecture = "gpt-1.3b";
  a.device_uuid = "GPU-0f1e2d3c";
  a.device_index = 1;
  a.step = step;
  a.time_us = 1'700'000'000'000'000 + step;
  a.reserved_bytes = 10;
  a.allocated_bytes = 11;
  a.active_bytes = 12;
  a.requested_bytes = 13;
  a.peak_reserved_bytes = 14;
  a.peak_allocated_bytes = 15;
  a.num_alloc_retries = 16;
  a.num_ooms = 17;
  a.cached_free_bytes = 18;
  a.largest_free_block = 19;
  a.max_allocatable = 20;
  a.stranded_bytes = 21;
  a.largest_request_bytes = 22;
  a.fragmentation_ratio = 0.375;
  a.free_block_count[0] = 1;
  a.free_block_bytes[0] = 1;
  a.free_block_count[21] = 300;
  a.free_block_bytes[21] = 300ull << 21;
  a.free_block_count[63] = 1;
  a.free_block_bytes[63] = ~std::uint64_t{0};
  a.forecast_level = RiskLevel::kWarning;
  a.steps_to_oom = step + 40;
  return a;
}

TEST(HistoryStoreTest, SamplesRoundTripEveryField) {
  HistoryOptions o;
  o.retention.max_age_s = 0;  // received at 555 µs after the epoch: far too old otherwise
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite", o);
  std::vector<agent::AgentSample> batch = {Sample("r1", 1), Sample("r1", 2), Sample("r2", 1)};
  batch[2].steps_to_oom.reset();
  batch[2].forecast_level = RiskLevel::kUnknown;
  ASSERT_TRUE(store->AppendSamples(batch, 555).ok());
  EXPECT_EQ(*store->CountSamples(), 3u);
  EXPECT_EQ(*store->CountSamples({.run = "r1", .job = ""}), 2u);
  EXPECT_EQ(*store->CountSamples({.run = "", .job = "job-7"}), 3u);
  EXPECT_EQ(*store->CountSamples({.run = "", .job = "other"}), 0u);

  Result<std::vector<ReceivedSample>> got = store->Samples({.run = "r1", .job = ""});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 2u);
  const agent::AgentSample want = Sample("r1", 2);
  const agent::AgentSample& a = (*got)[1].sample;
  EXPECT_EQ((*got)[1].received_us, 555);
  EXPECT_EQ(a.pid, want.pid);
  EXPECT_EQ(a.rank, want.rank);
  EXPECT_EQ(a.job, want.job);
  EXPECT_EQ(a.run, want.run);
  EXPECT_EQ(a.architecture, want.architecture);
  EXPECT_EQ(a.device_uuid, want.device_uuid);
  EXPECT_EQ(a.device_index, want.device_index);
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(a.time_us, want.time_us);
  EXPECT_EQ(a.reserved_bytes, 10u);
  EXPECT_EQ(a.allocated_bytes, 11u);
  EXPECT_EQ(a.active_bytes, 12u);
  EXPECT_EQ(a.requested_bytes, 13u);
  EXPECT_EQ(a.peak_reserved_bytes, 14u);
  EXPECT_EQ(a.peak_allocated_bytes, 15u);
  EXPECT_EQ(a.num_alloc_retries, 16u);
  EXPECT_EQ(a.largest_request_bytes, 22u);
  EXPECT_EQ(a.num_ooms, 17u);
  EXPECT_EQ(a.cached_free_bytes, 18u);
  EXPECT_EQ(a.largest_free_block, 19u);
  EXPECT_EQ(a.max_allocatable, 20u);
  EXPECT_EQ(a.stranded_bytes, 21u);
  EXPECT_EQ(a.fragmentation_ratio, 0.375);
  EXPECT_EQ(a.free_block_count, want.free_block_count);
  EXPECT_EQ(a.free_block_bytes, want.free_block_bytes);
  EXPECT_EQ(a.forecast_level, RiskLevel::kWarning);
  EXPECT_EQ(a.steps_to_oom, std::optional<std::int64_t>(42));
  Result<std::vector<ReceivedSample>> r2 = store->Samples({.run = "r2", .job = ""});
  ASSERT_EQ(r2->size(), 1u);
  EXPECT_FALSE((*r2)[0].sample.steps_to_oom.has_value());
  EXPECT_EQ((*r2)[0].sample.forecast_level, RiskLevel::kUnknown);
  EXPECT_EQ(store->Samples({}, 2)->size(), 2u);

  // Forgetting a run drops its samples too.
  ASSERT_TRUE(store->DeleteRun("r1").ok());
  EXPECT_EQ(*store->CountSamples(), 1u);
}

TEST(HistoryStoreTest, VersionOneDatabaseIsMigratedKeepingItsSamples) {
  // A schema-1 database (before samples had largest_request_bytes), made from a current one.
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  HistoryOptions o;
  o.retention.max_age_s = 0;
  {
    ASSERT_TRUE(OpenOrDie(path, o)
                    ->AppendSamples(std::vector<agent::AgentSample>{Sample("old", 1)}, 555)
                    .ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "ALTER TABLE samples DROP COLUMN largest_request_bytes; "
                         "DROP TRIGGER samples_bytes_insert; DROP TRIGGER samples_bytes_delete; "
                         "DELETE FROM counters WHERE name = 'sample_bytes'; "
                         "UPDATE schema_version SET version = 1",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);

  auto store = OpenOrDie(path, o);
  ASSERT_TRUE(store->AppendSamples(std::vector<agent::AgentSample>{Sample("new", 1)}, 556).ok());
  Result<std::vector<ReceivedSample>> got = store->Samples({});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].sample.run, "old");
  EXPECT_EQ((*got)[0].sample.largest_request_bytes, 0u);  // not recorded before version 2
  EXPECT_EQ((*got)[0].sample.stranded_bytes, 21u);
  EXPECT_EQ((*got)[1].sample.largest_request_bytes, 22u);
  // Version 3 counts the bytes of the samples it found.
  EXPECT_GT(*store->SampleBytes(), 2u * 200);
}

TEST(HistoryStoreTest, RetentionByRowsIsIncremental) {
  HistoryOptions o;
  o.retention.max_age_s = 0;
  o.retention.max_rows = 100;
  o.retention.prune_batch_rows = 30;
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite", o);
  std::vector<agent::AgentSample> batch;
  for (int i = 0; i < 200; ++i) batch.push_back(Sample("r", i));
  // Lower the limit under a full store: a backlog drains at most 30 rows a pass.
  {
    HistoryOptions keep = o;
    keep.retention.max_rows = 0;
    auto raw = OpenOrDie(store->path(), keep);
    ASSERT_TRUE(raw->AppendSamples(batch, 1).ok());
  }
  EXPECT_EQ(*store->CountSamples(), 200u);
  EXPECT_EQ(*store->PruneSamples(1), 30u);
  EXPECT_EQ(*store->CountSamples(), 170u);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->PruneSamples(1).ok());
  EXPECT_EQ(*store->CountSamples(), 100u);
  EXPECT_EQ(*store->PruneSamples(1), 0u);
  // The oldest went first.
  Result<std::vector<ReceivedSample>> left = store->Samples({}, 1);
  EXPECT_EQ((*left)[0].sample.step, 100);
}

// Issue 30, item 2: pruning starts from the limit and outruns any inflow: an append of N rows
// may delete 2N, so a batch larger than prune_batch_rows cannot grow the store past it.
TEST(HistoryStoreTest, Issue30PruningOutrunsTheInflow) {
  HistoryOptions o;
  o.retention.max_age_s = 0;
  o.retention.max_rows = 100;
  o.retention.prune_batch_rows = 30;
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite", o);
  std::vector<agent::AgentSample> batch;
  for (int i = 0; i < 500; ++i) batch.push_back(Sample("r", i));
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(store->AppendSamples(batch, 1).ok());
    EXPECT_EQ(*store->CountSamples(), 100u) << "round " << round;
  }
}

// Issue 30, item 2: retention by size: rows of long strings cannot take the disk at a row count
// that would be harmless for small ones.
TEST(HistoryStoreTest, Issue30RetentionByBytes) {
  HistoryOptions o;
  o.retention.max_age_s = 0;
  o.retention.max_rows = 0;
  o.retention.max_bytes = 200'000;
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite", o);
  std::vector<agent::AgentSample> batch;
  for (int i = 0; i < 50; ++i) {
    agent::AgentSample s = Sample("r", i);
    s.job = std::string(256, 'j');
    s.architecture = std::string(256, 'a');
    s.device_uuid = std::string(256, 'u');
    batch.push_back(s);
  }
  for (int round = 0; round < 10; ++round) ASSERT_TRUE(store->AppendSamples(batch, 1).ok());
  const std::uint64_t bytes = *store->SampleBytes();
  EXPECT_LE(bytes, 200'000u);
  EXPECT_GT(bytes, 150'000u);  // it prunes to the limit, not far below
  // Each row counts its strings: 200 + 3 * 256 + run and histogram.
  const std::uint64_t rows = *store->CountSamples();
  EXPECT_GE(bytes / rows, 200u + 3 * 256);
}

TEST(HistoryStoreTest, RetentionByAge) {
  HistoryOptions o;
  o.retention.max_age_s = 60;
  o.retention.max_rows = 0;
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite", o);
  const std::int64_t now = 1'000'000'000'000;
  std::vector<ReceivedSample> batch;
  for (int i = 0; i < 10; ++i)
    batch.push_back({Sample("r", i), now - (i < 4 ? 61 : 59) * 1'000'000});
  // AppendSamples prunes against the wall clock, which is far past `now`: all would go; so
  // prune explicitly against `now` instead, after an append with retention off.
  HistoryOptions keep = o;
  keep.retention.max_age_s = 0;
  {
    auto raw = OpenOrDie(store->path(), keep);
    ASSERT_TRUE(raw->AppendSamples(batch).ok());
  }
  EXPECT_EQ(*store->PruneSamples(now), 4u);
  EXPECT_EQ(*store->CountSamples(), 6u);
  EXPECT_EQ((*store->Samples({}, 1))[0].sample.step, 4);
}

TEST(HistoryStoreTest, EmptyBatchIsANoOp) {
  auto store = OpenOrDie(testing::MakeTempDir() + "/h.sqlite");
  EXPECT_TRUE(store->AppendSamples(std::span<const ReceivedSample>()).ok());
  EXPECT_EQ(*store->CountSamples(), 0u);
}

TEST(HistoryStoreTest, DamagedSampleBlobIsAnErrorNotACrash) {
  HistoryOptions o;
  o.retention.max_age_s = 0;
  const std::string path = testing::MakeTempDir() + "/h.sqlite";
  auto store = OpenOrDie(path, o);
  std::vector<agent::AgentSample> batch = {Sample("r", 1)};
  ASSERT_TRUE(store->AppendSamples(batch, 1).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE samples SET free_blocks = x'4001'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Result<std::vector<ReceivedSample>> got = store->Samples({.run = "", .job = ""});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kCorruption);
  EXPECT_NE(got.status().message().find("bad bucket 64"), std::string::npos);
}

TEST(HistoryStoreTest, ProcessesCreatingTheSameFileAtOnceAllSucceed) {
  const std::string path = testing::MakeTempDir() + "/new/history.sqlite";
  constexpr int kWriters = 4;
  std::vector<pid_t> pids;
  for (int i = 0; i < kWriters; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Result<std::unique_ptr<HistoryStore>> s = HistoryStore::Open(path);
      if (!s.ok()) {
        std::fprintf(stderr, "child: %s\n", s.status().ToString().c_str());
        _exit(3);
      }
      for (int k = 0; k < 10; ++k) {
        const std::string name = "w" + std::to_string(i) + "-" + std::to_string(k);
        if (!(*s)->RecordRun(Summary(name, "gpt", k)).ok()) _exit(4);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  auto store = OpenOrDie(path);
  EXPECT_EQ(store->ListRuns()->size(), static_cast<std::size_t>(kWriters * 10));
  EXPECT_TRUE(store->IntegrityCheck().ok());
}

TEST(HistogramBlobTest, RoundTripAndValidation) {
  agent::AgentSample a = Sample("r", 1);
  const std::string blob = EncodeHistogram(a);
  EXPECT_LT(blob.size(), 40u);  // three buckets, not 128 integers
  agent::AgentSample b;
  ASSERT_TRUE(DecodeHistogram(blob, &b).ok());
  EXPECT_EQ(b.free_block_count, a.free_block_count);
  EXPECT_EQ(b.free_block_bytes, a.free_block_bytes);
  EXPECT_TRUE(DecodeHistogram("", &b).ok());
  EXPECT_EQ(b.free_block_count[21], 0u);

  EXPECT_FALSE(DecodeHistogram(std::string("\x40\x01\x01", 3), &b).ok());              // bucket 64
  EXPECT_FALSE(DecodeHistogram(std::string("\x05\x01\x01\x05\x01\x01", 6), &b).ok());  // repeat
  EXPECT_FALSE(DecodeHistogram(std::string("\x05\x81", 2), &b).ok());  // truncated varint
  EXPECT_FALSE(DecodeHistogram(std::string("\x05\x01", 2), &b).ok());  // bytes missing
  EXPECT_FALSE(DecodeHistogram(std::string("\x05\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x01", 12),
                               &b)
                   .ok());  // > 64 bits
}

}  // namespace
}  // namespace fragscope::sinks
