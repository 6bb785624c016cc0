#include "sinks/history/history_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <sys/stat.h>

#include "common/safe_file.h"

namespace fragscope::sinks {
namespace {

// ---- Schema and migrations ----
//
// Migration i (0-based) brings a database from schema version i to i + 1. Append new ones; never
// edit a released one. Each runs inside the transaction that also bumps schema_version.
constexpr const char* kMigrations[] = {
    // 0 -> 1
    R"sql(
CREATE TABLE schema_version(version INTEGER NOT NULL);
INSERT INTO schema_version(version) VALUES (0);
CREATE TABLE runs(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  architecture TEXT NOT NULL,
  recorded_unix_s INTEGER NOT NULL,
  source TEXT NOT NULL,
  device INTEGER NOT NULL,
  steps INTEGER NOT NULL,
  peak_allocated_bytes INTEGER NOT NULL,
  peak_reserved_bytes INTEGER NOT NULL,
  request_count INTEGER NOT NULL,
  request_p50_bytes INTEGER NOT NULL,
  request_p90_bytes INTEGER NOT NULL,
  request_p99_bytes INTEGER NOT NULL,
  request_max_bytes INTEGER NOT NULL,
  fragmentation_growth_per_1000_steps REAL,
  num_ooms INTEGER NOT NULL
);
CREATE INDEX runs_by_architecture ON runs(architecture, recorded_unix_s DESC, id DESC);
CREATE TABLE run_marks(
  run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step INTEGER NOT NULL,
  fragmentation_ratio REAL NOT NULL,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE samples(
  id INTEGER PRIMARY KEY,
  received_us INTEGER NOT NULL,
  run TEXT NOT NULL,
  job TEXT NOT NULL,
  architecture TEXT NOT NULL,
  pid INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  device_uuid TEXT NOT NULL,
  device_index INTEGER NOT NULL,
  step INTEGER NOT NULL,
  time_us INTEGER NOT NULL,
  reserved_bytes INTEGER NOT NULL,
  allocated_bytes INTEGER NOT NULL,
  active_bytes INTEGER NOT NULL,
  requested_bytes INTEGER NOT NULL,
  peak_reserved_bytes INTEGER NOT NULL,
  peak_allocated_bytes INTEGER NOT NULL,
  num_alloc_retries INTEGER NOT NULL,
  num_ooms INTEGER NOT NULL,
  cached_free_bytes INTEGER NOT NULL,
  largest_free_block INTEGER NOT NULL,
  max_allocatable INTEGER NOT NULL,
  stranded_bytes INTEGER NOT NULL,
  fragmentation_ratio REAL NOT NULL,
  forecast_level INTEGER NOT NULL,
  steps_to_oom INTEGER,
  free_blocks BLOB NOT NULL
);
CREATE INDEX samples_by_run ON samples(run, job, pid, rank, device_uuid, step);
CREATE INDEX samples_by_received ON samples(received_us);
-- Row count kept by triggers: count(*) would scan the table on every prune.
CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT INTO counters(name, value) VALUES ('samples', 0);
CREATE TRIGGER samples_count_insert AFTER INSERT ON samples BEGIN
  UPDATE counters SET value = value + 1 WHERE name = 'samples';
END;
CREATE TRIGGER samples_count_delete AFTER DELETE ON samples BEGIN
  UPDATE counters SET value = value - 1 WHERE name = 'samples';
END;
)sql",
    // 1 -> 2: the agent protocol's largest_request_bytes (0 in samples stored before it).
    R"sql(
ALTER TABLE samples ADD COLUMN largest_request_bytes INTEGER NOT NULL DEFAULT 0;
)sql",
    // 2 -> 3: the bytes the samples take, kept by triggers, for retention by size (a row's
    // strings and histogram plus 200 bytes for its numbers, index entries and page overhead).
    R"sql(
INSERT INTO counters(name, value) SELECT 'sample_bytes', coalesce(sum(
  200 + length(CAST(run AS BLOB)) + length(CAST(job AS BLOB)) +
  length(CAST(architecture AS BLOB)) + length(CAST(device_uuid AS BLOB)) + length(free_blocks)),
  0) FROM samples;
CREATE TRIGGER samples_bytes_insert AFTER INSERT ON samples BEGIN
  UPDATE counters SET value = value + 200 + length(CAST(NEW.run AS BLOB)) +
    length(CAST(NEW.job AS BLOB)) + length(CAST(NEW.architecture AS BLOB)) +
    length(CAST(NEW.device_uuid AS BLOB)) + length(NEW.free_blocks) WHERE name = 'sample_bytes';
END;
CREATE TRIGGER samples_bytes_delete AFTER DELETE ON samples BEGIN
  UPDATE counters SET value = value - 200 - length(CAST(OLD.run AS BLOB)) -
    length(CAST(OLD.job AS BLOB)) - length(CAST(OLD.architecture AS BLOB)) -
    length(CAST(OLD.device_uuid AS BLOB)) - length(OLD.free_blocks) WHERE name = 'sample_bytes';
END;
)sql",
};
static_assert(std::size(kMigrations) == kHistorySchemaVersion);

constexpr char kSqliteMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f',
                                   'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};

// A prepared statement, finalized when it goes out of scope.
class Stmt {
 public:
  explicit Stmt(sqlite3_stmt* s) : s_(s) {}
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  sqlite3_stmt* get() const { return s_; }

  void Bind(int i, std::int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void BindU(int i, std::uint64_t v) { sqlite3_bind_int64(s_, i, static_cast<std::int64_t>(v)); }
  void Bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindNull(int i) { sqlite3_bind_null(s_, i); }

  std::int64_t Int(int c) const { return sqlite3_column_int64(s_, c); }
  std::uint64_t UInt(int c) const {
    return static_cast<std::uint64_t>(sqlite3_column_int64(s_, c));
  }
  double Real(int c) const { return sqlite3_column_double(s_, c); }
  bool IsNull(int c) const { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  std::string Text(int c) const {
    const unsigned char* t = sqlite3_column_text(s_, c);
    return t ? std::string(reinterpret_cast<const char*>(t),
                           static_cast<std::size_t>(sqlite3_column_bytes(s_, c)))
             : std::string();
  }
  std::string Blob(int c) const {
    const void* b = sqlite3_column_blob(s_, c);
    return b ? std::string(static_cast<const char*>(b),
                           static_cast<std::size_t>(sqlite3_column_bytes(s_, c)))
             : std::string();
  }

 private:
  sqlite3_stmt* s_;
};

StatusCode CodeFor(int rc) {
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
    case SQLITE_FORMAT:
      return StatusCode::kCorruption;
    case SQLITE_CANTOPEN:
    case SQLITE_NOTFOUND:
      return StatusCode::kNotFound;
    default:
      return StatusCode::kIoError;
  }
}

// mkdir -p with mode 0700 for the directories it creates (the XDG spec's mode).
Status MakeDirs(const std::string& dir) {
  if (dir.empty()) return Status::Ok();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Status::Ok();
    return Status::IoError(fmt::format("{}: exists and is not a directory", dir));
  }
  const std::size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    FRAGSCOPE_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::IoError(fmt::format("{}: cannot create directory: {}", dir, strerror(errno)));
  }
  return Status::Ok();
}

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void PutVarint(std::uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view* in, std::uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in->empty()) return false;
    const auto byte = static_cast<std::uint8_t>(in->front());
    in->remove_prefix(1);
    if (shift == 63 && byte > 1) return false;  // more than 64 bits
    *v |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace

// ---- Histogram blob ----

std::string EncodeHistogram(const agent::AgentSample& sample) {
  std::string out;
  for (int b = 0; b < agent::kFreeBlockBuckets; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (sample.free_block_count[i] == 0 && sample.free_block_bytes[i] == 0) continue;
    out.push_back(static_cast<char>(b));
    PutVarint(sample.free_block_count[i], &out);
    PutVarint(sample.free_block_bytes[i], &out);
  }
  return out;
}

Status DecodeHistogram(std::string_view blob, agent::AgentSample* sample) {
  sample->free_block_count.fill(0);
  sample->free_block_bytes.fill(0);
  const std::size_t size = blob.size();
  int previous = -1;
  while (!blob.empty()) {
    const std::size_t offset = size - blob.size();
    const int b = static_cast<std::uint8_t>(blob.front());
    blob.remove_prefix(1);
    if (b >= agent::kFreeBlockBuckets || b <= previous) {
      return Status::Corruption(
          fmt::format("free-block histogram: bad bucket {} at byte {}", b, offset));
    }
    previous = b;
    const auto i = static_cast<std::size_t>(b);
    if (!GetVarint(&blob, &sample->free_block_count[i]) ||
        !GetVarint(&blob, &sample->free_block_bytes[i])) {
      return Status::Corruption(
          fmt::format("free-block histogram: truncated bucket {} at byte {}", b, offset));
    }
  }
  return Status::Ok();
}

// ---- Location ----

Result<std::string> DefaultHistoryPath() {
  constexpr std::string_view kTail = "/fragscope/history.sqlite";
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && state[0] == '/') return std::string(state) + std::string(kTail);
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    return std::string(home) + "/.local/state" + std::string(kTail);
  }
  return Status::InvalidArgument(
      "no history location: neither XDG_STATE_HOME nor HOME is an absolute path; pass "
      "--history PATH");
}

// ---- Opening ----

HistoryStore::HistoryStore(std::string path, sqlite3* db, HistoryOptions options)
    : path_(std::move(path)), db_(db), options_(options) {}

HistoryStore::~HistoryStore() { sqlite3_close_v2(db_); }

Status HistoryStore::Error(const char* what) const {
  const int rc = sqlite3_extended_errcode(db_);
  return Status(CodeFor(rc), fmt::format("{}: {}: {}", path_, what, sqlite3_errmsg(db_)));
}

Status HistoryStore::UnreadableError(const char* what) const {
  const int rc = sqlite3_extended_errcode(db_) & 0xff;
  const char* verdict = rc == SQLITE_CORRUPT  ? "damaged database"
                        : rc == SQLITE_NOTADB ? "not a fragscope history: not a SQLite database"
                                              : "cannot read the database";
  return Status(CodeFor(rc), fmt::format("{}: {}: cannot read {}: {}; refusing to touch it (move "
                                         "it away or pass another --history PATH)",
                                         path_, verdict, what, sqlite3_errmsg(db_)));
}

Status HistoryStore::Exec(const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return Status::Ok();
  Status s(CodeFor(rc), fmt::format("{}: {}", path_, err ? err : sqlite3_errstr(rc)));
  sqlite3_free(err);
  return s;
}

Result<sqlite3_stmt*> HistoryStore::Prepare(const char* sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return Error("preparing a statement");
  }
  return stmt;
}

namespace {

// Looks at the first bytes before SQLite does: a file that is not a SQLite database is refused
// without handing it to SQLite at all. `exists` and `empty` report what was found.
Status CheckHeader(const std::string& path, bool* exists, bool* empty) {
  *exists = false;
  *empty = false;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    if (errno == ELOOP) {
      return Status::InvalidArgument(fmt::format(
          "history {}: is a symbolic link; a history database is opened only as a regular file",
          path));
    }
    return Status::IoError(fmt::format("{}: cannot open: {}", path, strerror(errno)));
  }
  *exists = true;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::InvalidArgument(fmt::format("{}: not a regular file", path));
  }
  char header[100];
  std::size_t got = 0;
  while (got < sizeof header) {
    const ssize_t n = read(fd, header + got, sizeof header - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  close(fd);
  if (st.st_size == 0) {
    *empty = true;  // SQLite's own view too: an empty file is an empty database
    return Status::Ok();
  }
  if (got < sizeof header || std::memcmp(header, kSqliteMagic, sizeof kSqliteMagic) != 0) {
    return Status::Corruption(fmt::format(
        "{}: not a fragscope history: not a SQLite database ({} bytes, {}); refusing to touch "
        "it (move it away or pass another --history PATH)",
        path, st.st_size,
        got < sizeof header ? "shorter than a SQLite header" : "no SQLite header"));
  }
  return Status::Ok();
}

}  // namespace

Status HistoryStore::CheckOwnership(bool* fresh) {
  std::int64_t app_id = 0, objects = 0;
  {
    Result<sqlite3_stmt*> s = Prepare("PRAGMA application_id");
    if (!s.ok()) return UnreadableError("its header");
    Stmt stmt(*s);
    if (sqlite3_step(stmt.get()) != SQLITE_ROW) return UnreadableError("its header");
    app_id = stmt.Int(0);
  }
  {
    Result<sqlite3_stmt*> s = Prepare("SELECT count(*) FROM sqlite_schema");
    if (!s.ok()) return UnreadableError("its schema");
    Stmt stmt(*s);
    if (sqlite3_step(stmt.get()) != SQLITE_ROW) return UnreadableError("its schema");
    objects = stmt.Int(0);
  }
  *fresh = objects == 0 && (app_id == 0 || app_id == kHistoryApplicationId);
  if (!*fresh && app_id != kHistoryApplicationId) {
    return Status::Corruption(
        fmt::format("{}: not a fragscope history: a SQLite database of another application "
                    "(application_id 0x{:08x}, {} schema objects); refusing to touch it",
                    path_, static_cast<std::uint32_t>(app_id), objects));
  }
  if (!*fresh) {
    Result<sqlite3_stmt*> s = Prepare("PRAGMA quick_check(5)");
    if (!s.ok()) return s.status().WithPrefix("quick_check");
    Stmt stmt(*s);
    std::string problems;
    int step;
    while ((step = sqlite3_step(stmt.get())) == SQLITE_ROW) {
      const std::string line = stmt.Text(0);
      if (line == "ok") continue;
      if (!problems.empty()) problems += "; ";
      problems += line;
    }
    if (step != SQLITE_DONE) return Error("damaged: quick_check failed");
    if (!problems.empty()) {
      return Status::Corruption(fmt::format(
          "{}: damaged fragscope history: quick_check: {}; refusing to use it (keep it for "
          "recovery with `sqlite3 {} .recover`, or pass another --history PATH)",
          path_, problems, path_));
    }
  }

  return Status::Ok();
}

Result<std::unique_ptr<HistoryStore>> HistoryStore::Open(const std::string& path,
                                                         const HistoryOptions& options) {
  if (path.empty()) return Status::InvalidArgument("history path is empty");
  // Never through a link (issue 24 item 4): not the database, nor the files SQLite keeps beside
  // it (a link planted at history.sqlite-wal would be written through by SQLite's own open).
  // SQLITE_OPEN_NOFOLLOW below covers the database against a link made after this check.
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
    const std::string file = path + suffix;
    if (Status s = RefuseLinkOrSpecial(file, "history"); !s.ok()) {
      return Status::InvalidArgument(fmt::format(
          "{}; refusing it: a history database is opened only as a regular file, never "
          "through a link (move the link away, or pass the file itself with --history PATH)",
          s.message()));
    }
  }
  bool exists = false, empty = false;
  FRAGSCOPE_RETURN_IF_ERROR(CheckHeader(path, &exists, &empty));
  if (!exists) {
    if (!options.create_if_missing) {
      return Status::NotFound(fmt::format("{}: no history database there", path));
    }
    const std::size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      FRAGSCOPE_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
    }
  }

  sqlite3* raw = nullptr;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW;
  if (!exists) flags |= SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  // Owned from here on, even on failure (sqlite3_open_v2 may allocate a handle).
  std::unique_ptr<HistoryStore> store(new HistoryStore(path, raw, options));
  if (rc != SQLITE_OK) {
    if (raw == nullptr) return Status::OutOfMemory(fmt::format("{}: sqlite3_open_v2", path));
    return store->Error("cannot open");
  }
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, options.busy_timeout_ms);

  // Read-only checks first: nothing is written until the file is known to be ours. They run in
  // one read transaction, so that a process creating the same file at the same moment is seen
  // either before or after its migration commits, never half-way.
  bool fresh = false;
  FRAGSCOPE_RETURN_IF_ERROR(store->Exec("BEGIN"));
  Status checked = store->CheckOwnership(&fresh);
  (void)store->Exec("COMMIT");  // a read transaction: nothing to commit, releases the snapshot
  FRAGSCOPE_RETURN_IF_ERROR(checked);

  // Ours (or new): WAL, durability, foreign keys, then migrations.
  FRAGSCOPE_RETURN_IF_ERROR(store->SwitchToWal());
  FRAGSCOPE_RETURN_IF_ERROR(
      store->Exec(options.sync_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  FRAGSCOPE_RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON"));

  // Migrate under a write lock; another process may be doing the same, so the version is read
  // again inside the transaction.
  FRAGSCOPE_RETURN_IF_ERROR(store->Exec("BEGIN IMMEDIATE"));
  auto migrate = [&]() -> Status {
    int version = 0;
    {
      Result<sqlite3_stmt*> s = store->Prepare(
          "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'schema_version'");
      if (!s.ok()) return s.status();
      Stmt stmt(*s);
      if (sqlite3_step(stmt.get()) != SQLITE_ROW) return store->Error("reading the schema");
      if (stmt.Int(0) == 1) {
        Result<sqlite3_stmt*> v = store->Prepare("SELECT version FROM schema_version");
        if (!v.ok()) return v.status();
        Stmt vs(*v);
        if (sqlite3_step(vs.get()) != SQLITE_ROW) {
          return Status::Corruption(
              fmt::format("{}: damaged fragscope history: schema_version is empty", path));
        }
        version = static_cast<int>(vs.Int(0));
      } else if (!fresh) {
        return Status::Corruption(
            fmt::format("{}: damaged fragscope history: it has fragscope's application_id but no "
                        "schema_version table",
                        path));
      }
    }
    if (version > kHistorySchemaVersion || version < 0) {
      return Status::Corruption(fmt::format(
          "{}: history schema version {} is newer than this fragscope knows ({}); upgrade "
          "fragscope",
          path, version, kHistorySchemaVersion));
    }
    for (int v = version; v < kHistorySchemaVersion; ++v) {
      FRAGSCOPE_RETURN_IF_ERROR(
          store->Exec(kMigrations[v])
              .WithPrefix(fmt::format("migrating the history schema from version {}", v)));
    }
    if (version < kHistorySchemaVersion) {
      Result<sqlite3_stmt*> u = store->Prepare("UPDATE schema_version SET version = ?");
      if (!u.ok()) return u.status();
      Stmt us(*u);
      us.Bind(1, std::int64_t{kHistorySchemaVersion});
      if (sqlite3_step(us.get()) != SQLITE_DONE) return store->Error("setting the schema version");
      // A constant, not a value from outside: PRAGMA takes no bound parameters.
      const std::string set_id = fmt::format("PRAGMA application_id={}", kHistoryApplicationId);
      FRAGSCOPE_RETURN_IF_ERROR(store->Exec(set_id.c_str()));
    }
    return Status::Ok();
  };
  Status migrated = migrate();
  if (!migrated.ok()) {
    (void)store->Exec("ROLLBACK");
    return migrated;
  }
  FRAGSCOPE_RETURN_IF_ERROR(store->Exec("COMMIT"));
  return store;
}

Status HistoryStore::SwitchToWal() {
  // Changing the journal mode takes an exclusive lock and does not wait through the busy
  // handler, so two processes creating one file at once may see SQLITE_BUSY: retry until the
  // busy timeout.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.busy_timeout_ms);
  for (;;) {
    Result<sqlite3_stmt*> s = Prepare("PRAGMA journal_mode=WAL");
    if (!s.ok()) return s.status();
    Stmt stmt(*s);
    const int rc = sqlite3_step(stmt.get());
    if (rc == SQLITE_ROW && stmt.Text(0) == "wal") return Status::Ok();
    if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) {
      return Error("cannot switch to WAL mode");
    }
    if (std::chrono::steady_clock::now() >= deadline) return Error("cannot switch to WAL mode");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status HistoryStore::IntegrityCheck() {
  Result<sqlite3_stmt*> s = Prepare("PRAGMA integrity_check");
  if (!s.ok()) return s.status();
  Stmt stmt(*s);
  std::string problems;
  int rc;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    const std::string line = stmt.Text(0);
    if (line == "ok") continue;
    if (!problems.empty()) problems += "; ";
    problems += line;
  }
  if (rc != SQLITE_DONE) return Error("integrity_check");
  if (!problems.empty()) {
    return Status::Corruption(fmt::format("{}: integrity_check: {}", path_, problems));
  }
  return Status::Ok();
}

// ---- Run summaries ----

namespace {

constexpr const char* kRunColumns =
    "id, name, architecture, recorded_unix_s, source, device, steps, peak_allocated_bytes, "
    "peak_reserved_bytes, request_count, request_p50_bytes, request_p90_bytes, "
    "request_p99_bytes, request_max_bytes, fragmentation_growth_per_1000_steps, num_ooms";

analysis::RunSummary ReadRun(const Stmt& s) {
  analysis::RunSummary r;
  r.run = s.Text(1);
  r.architecture = s.Text(2);
  r.recorded_unix_s = s.Int(3);
  r.source = s.Text(4);
  r.device = static_cast<std::int32_t>(s.Int(5));
  r.steps = s.UInt(6);
  r.peak_allocated_bytes = s.UInt(7);
  r.peak_reserved_bytes = s.UInt(8);
  r.request_count = s.UInt(9);
  r.request_p50_bytes = s.UInt(10);
  r.request_p90_bytes = s.UInt(11);
  r.request_p99_bytes = s.UInt(12);
  r.request_max_bytes = s.UInt(13);
  if (!s.IsNull(14)) r.fragmentation_growth_per_1000_steps = s.Real(14);
  r.num_ooms = s.UInt(15);
  return r;
}

}  // namespace

Status HistoryStore::RecordRun(const analysis::RunSummary& r, bool replace) {
  if (r.run.empty()) return Status::InvalidArgument("a run needs a name");
  if (r.architecture.empty()) {
    return Status::InvalidArgument(fmt::format("run {} needs an architecture label", r.run));
  }
  FRAGSCOPE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto write = [&]() -> Status {
    if (replace) {
      Result<sqlite3_stmt*> d = Prepare("DELETE FROM runs WHERE name = ?");
      if (!d.ok()) return d.status();
      Stmt del(*d);
      del.Bind(1, r.run);
      if (sqlite3_step(del.get()) != SQLITE_DONE) return Error("replacing a run");
    }
    Result<sqlite3_stmt*> p = Prepare(
        "INSERT INTO runs(name, architecture, recorded_unix_s, source, device, steps, "
        "peak_allocated_bytes, peak_reserved_bytes, request_count, request_p50_bytes, "
        "request_p90_bytes, request_p99_bytes, request_max_bytes, "
        "fragmentation_growth_per_1000_steps, num_ooms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!p.ok()) return p.status();
    Stmt ins(*p);
    ins.Bind(1, r.run);
    ins.Bind(2, r.architecture);
    ins.Bind(3, r.recorded_unix_s);
    ins.Bind(4, r.source);
    ins.Bind(5, std::int64_t{r.device});
    ins.BindU(6, r.steps);
    ins.BindU(7, r.peak_allocated_bytes);
    ins.BindU(8, r.peak_reserved_bytes);
    ins.BindU(9, r.request_count);
    ins.BindU(10, r.request_p50_bytes);
    ins.BindU(11, r.request_p90_bytes);
    ins.BindU(12, r.request_p99_bytes);
    ins.BindU(13, r.request_max_bytes);
    if (r.fragmentation_growth_per_1000_steps) {
      ins.Bind(14, *r.fragmentation_growth_per_1000_steps);
    } else {
      ins.BindNull(14);
    }
    ins.BindU(15, r.num_ooms);
    const int rc = sqlite3_step(ins.get());
    if (rc == SQLITE_CONSTRAINT_UNIQUE) {
      return Status::InvalidArgument(fmt::format(
          "{}: a run named {} is already recorded (forget it first, or replace it)", path_, r.run));
    }
    if (rc != SQLITE_DONE) return Error("recording a run");
    const std::int64_t id = sqlite3_last_insert_rowid(db_);
    Result<sqlite3_stmt*> m =
        Prepare("INSERT INTO run_marks(run_id, step, fragmentation_ratio) VALUES (?, ?, ?)");
    if (!m.ok()) return m.status();
    Stmt mark(*m);
    for (const analysis::FragmentationMark& fm : r.marks) {
      sqlite3_reset(mark.get());
      mark.Bind(1, id);
      mark.Bind(2, fm.step);
      mark.Bind(3, fm.fragmentation_ratio);
      if (sqlite3_step(mark.get()) != SQLITE_DONE) return Error("recording a step mark");
    }
    return Status::Ok();
  };
  Status written = write();
  if (!written.ok()) {
    (void)Exec("ROLLBACK");
    return written;
  }
  return Exec("COMMIT");
}

Result<std::vector<analysis::RunSummary>> HistoryStore::ListRuns(const RunFilter& filter) {
  const std::string sql = fmt::format(
      "SELECT {} FROM runs WHERE (?1 = '' OR architecture = ?1) AND (?2 = '' OR name = ?2) "
      "ORDER BY recorded_unix_s DESC, id DESC LIMIT ?3",
      kRunColumns);
  Result<sqlite3_stmt*> p = Prepare(sql.c_str());
  if (!p.ok()) return p.status();
  Stmt s(*p);
  s.Bind(1, filter.architecture);
  s.Bind(2, filter.run);
  s.Bind(3, filter.limit == 0 ? std::int64_t{-1} : static_cast<std::int64_t>(filter.limit));
  Result<sqlite3_stmt*> pm =
      Prepare("SELECT step, fragmentation_ratio FROM run_marks WHERE run_id = ? ORDER BY step");
  if (!pm.ok()) return pm.status();
  Stmt marks(*pm);
  std::vector<analysis::RunSummary> runs;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    runs.push_back(ReadRun(s));
    sqlite3_reset(marks.get());
    marks.Bind(1, s.Int(0));
    int mrc;
    while ((mrc = sqlite3_step(marks.get())) == SQLITE_ROW) {
      runs.back().marks.push_back({marks.Int(0), marks.Real(1)});
    }
    if (mrc != SQLITE_DONE) return Error("reading step marks");
  }
  if (rc != SQLITE_DONE) return Error("listing runs");
  return runs;
}

Result<std::vector<analysis::RunSummary>> HistoryStore::LastRuns(const std::string& architecture,
                                                                 std::size_t n) {
  if (n == 0) return std::vector<analysis::RunSummary>{};
  RunFilter f;
  f.architecture = architecture;
  f.limit = n;
  if (architecture.empty()) return Status::InvalidArgument("an architecture label is needed");
  return ListRuns(f);
}

Result<std::optional<analysis::RunSummary>> HistoryStore::FindRun(const std::string& run) {
  if (run.empty()) return std::optional<analysis::RunSummary>();
  RunFilter f;
  f.run = run;
  Result<std::vector<analysis::RunSummary>> runs = ListRuns(f);
  if (!runs.ok()) return runs.status();
  if (runs->empty()) return std::optional<analysis::RunSummary>();
  return std::optional<analysis::RunSummary>(std::move(runs->front()));
}

Result<bool> HistoryStore::DeleteRun(const std::string& run) {
  FRAGSCOPE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  bool deleted = false;
  auto del = [&]() -> Status {
    Result<sqlite3_stmt*> p = Prepare("DELETE FROM runs WHERE name = ?");
    if (!p.ok()) return p.status();
    Stmt s(*p);
    s.Bind(1, run);
    if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("deleting a run");
    deleted = sqlite3_changes(db_) > 0;
    Result<sqlite3_stmt*> ps = Prepare("DELETE FROM samples WHERE run = ?");
    if (!ps.ok()) return ps.status();
    Stmt samples(*ps);
    samples.Bind(1, run);
    if (sqlite3_step(samples.get()) != SQLITE_DONE) return Error("deleting a run's samples");
    return Status::Ok();
  };
  Status s = del();
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    return s;
  }
  FRAGSCOPE_RETURN_IF_ERROR(Exec("COMMIT"));
  return deleted;
}

// ---- Agent samples ----

Status HistoryStore::AppendSamples(std::span<const agent::AgentSample> samples,
                                   std::int64_t received_us) {
  std::vector<ReceivedSample> received;
  received.reserve(samples.size());
  for (const agent::AgentSample& s : samples) received.push_back({s, received_us});
  return AppendSamples(received);
}

Status HistoryStore::AppendSamples(std::span<const ReceivedSample> samples) {
  if (samples.empty()) return Status::Ok();
  FRAGSCOPE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto write = [&]() -> Status {
    Result<sqlite3_stmt*> p = Prepare(
        "INSERT INTO samples(received_us, run, job, architecture, pid, rank, device_uuid, "
        "device_index, step, time_us, reserved_bytes, allocated_bytes, active_bytes, "
        "requested_bytes, peak_reserved_bytes, peak_allocated_bytes, num_alloc_retries, "
        "num_ooms, cached_free_bytes, largest_free_block, max_allocatable, stranded_bytes, "
        "fragmentation_ratio, forecast_level, steps_to_oom, free_blocks, largest_request_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!p.ok()) return p.status();
    Stmt ins(*p);
    for (const ReceivedSample& rs : samples) {
      const agent::AgentSample& a = rs.sample;
      sqlite3_reset(ins.get());
      ins.Bind(1, rs.received_us);
      ins.Bind(2, a.run);
      ins.Bind(3, a.job);
      ins.Bind(4, a.architecture);
      ins.Bind(5, std::int64_t{a.pid});
      ins.Bind(6, std::int64_t{a.rank});
      ins.Bind(7, a.device_uuid);
      ins.Bind(8, std::int64_t{a.device_index});
      ins.Bind(9, a.step);
      ins.Bind(10, a.time_us);
      ins.BindU(11, a.reserved_bytes);
      ins.BindU(12, a.allocated_bytes);
      ins.BindU(13, a.active_bytes);
      ins.BindU(14, a.requested_bytes);
      ins.BindU(15, a.peak_reserved_bytes);
      ins.BindU(16, a.peak_allocated_bytes);
      ins.BindU(17, a.num_alloc_retries);
      ins.BindU(18, a.num_ooms);
      // The columns are NOT NULL: an unknown summary figure is stored as 0.
      ins.BindU(19, a.cached_free_bytes.value_or(0));
      ins.BindU(20, a.largest_free_block.value_or(0));
      ins.BindU(21, a.max_allocatable.value_or(0));
      ins.BindU(22, a.stranded_bytes.value_or(0));
      ins.Bind(23, a.fragmentation_ratio.value_or(0.0));
      ins.Bind(24, static_cast<std::int64_t>(a.forecast_level));
      if (a.steps_to_oom) {
        ins.Bind(25, *a.steps_to_oom);
      } else {
        ins.BindNull(25);
      }
      ins.BindBlob(26, EncodeHistogram(a));
      ins.BindU(27, a.largest_request_bytes);
      if (sqlite3_step(ins.get()) != SQLITE_DONE) return Error("appending samples");
    }
    return Status::Ok();
  };
  Status written = write();
  if (!written.ok()) {
    (void)Exec("ROLLBACK");
    return written;
  }
  FRAGSCOPE_RETURN_IF_ERROR(Exec("COMMIT"));
  // The samples are committed; a failed prune (e.g. another writer holds the lock past the
  // busy timeout) is retried by the next append, so it is not reported as a failed append.
  // Each pass may delete twice what was just added, so pruning outruns any inflow.
  (void)PruneSamples(NowUs(), 2 * static_cast<std::uint64_t>(samples.size()));
  return Status::Ok();
}

Result<std::uint64_t> HistoryStore::SampleBytes() {
  Result<sqlite3_stmt*> p = Prepare("SELECT value FROM counters WHERE name = 'sample_bytes'");
  if (!p.ok()) return p.status();
  Stmt s(*p);
  if (sqlite3_step(s.get()) != SQLITE_ROW) return Error("reading the samples' size");
  return s.UInt(0);
}

Result<std::uint64_t> HistoryStore::PruneSamples(std::int64_t now_us, std::uint64_t min_rows) {
  const SampleRetention& r = options_.retention;
  if (r.max_age_s <= 0 && r.max_rows == 0 && r.max_bytes == 0) return std::uint64_t{0};
  const std::int64_t budget = static_cast<std::int64_t>(
      std::max<std::uint64_t>({1, r.prune_batch_rows, std::min<std::uint64_t>(min_rows, 1 << 30)}));
  std::uint64_t deleted = 0;
  FRAGSCOPE_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto prune = [&]() -> Status {
    if (r.max_age_s > 0) {
      Result<sqlite3_stmt*> p = Prepare(
          "DELETE FROM samples WHERE id IN (SELECT id FROM samples WHERE received_us < ? "
          "LIMIT ?)");
      if (!p.ok()) return p.status();
      Stmt s(*p);
      s.Bind(1, now_us - r.max_age_s * 1'000'000);
      s.Bind(2, budget);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("pruning old samples");
      deleted += static_cast<std::uint64_t>(sqlite3_changes(db_));
    }
    const std::int64_t left = budget - static_cast<std::int64_t>(deleted);
    if (r.max_rows > 0 && left > 0) {
      Result<sqlite3_stmt*> p = Prepare(
          "DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT "
          "min(?, max(0, (SELECT value FROM counters WHERE name = 'samples') - ?)))");
      if (!p.ok()) return p.status();
      Stmt s(*p);
      s.Bind(1, left);
      s.BindU(2, r.max_rows);
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("pruning samples over the limit");
      deleted += static_cast<std::uint64_t>(sqlite3_changes(db_));
    }
    // By size: the oldest rows go, a chunk at a time, until the samples fit max_bytes.
    while (r.max_bytes > 0 && budget - static_cast<std::int64_t>(deleted) > 0) {
      Result<std::uint64_t> bytes = SampleBytes();
      if (!bytes.ok()) return bytes.status();
      if (*bytes <= r.max_bytes) break;
      Result<std::uint64_t> rows = CountSamples();
      if (!rows.ok()) return rows.status();
      if (*rows == 0) break;
      // The excess over the average row: about the rows to go, so the store ends near the
      // limit, not far below it.
      const std::uint64_t average = std::max<std::uint64_t>(1, *bytes / *rows);
      const auto chunk = static_cast<std::int64_t>(
          std::min<std::uint64_t>(1000, (*bytes - r.max_bytes) / average + 1));
      Result<sqlite3_stmt*> p =
          Prepare("DELETE FROM samples WHERE id IN (SELECT id FROM samples ORDER BY id LIMIT ?)");
      if (!p.ok()) return p.status();
      Stmt s(*p);
      s.Bind(1, std::min<std::int64_t>(chunk, budget - static_cast<std::int64_t>(deleted)));
      if (sqlite3_step(s.get()) != SQLITE_DONE) return Error("pruning samples over the size");
      const auto n = static_cast<std::uint64_t>(sqlite3_changes(db_));
      if (n == 0) break;
      deleted += n;
    }
    return Status::Ok();
  };
  Status s = prune();
  if (!s.ok()) {
    (void)Exec("ROLLBACK");
    return s;
  }
  FRAGSCOPE_RETURN_IF_ERROR(Exec("COMMIT"));
  return deleted;
}

Result<std::uint64_t> HistoryStore::CountSamples(const SampleFilter& filter) {
  const bool all = filter.run.empty() && filter.job.empty();
  Result<sqlite3_stmt*> p =
      Prepare(all ? "SELECT value FROM counters WHERE name = 'samples'"
                  : "SELECT count(*) FROM samples WHERE (?1 = '' OR run = ?1) AND "
                    "(?2 = '' OR job = ?2)");
  if (!p.ok()) return p.status();
  Stmt s(*p);
  if (!all) {
    s.Bind(1, filter.run);
    s.Bind(2, filter.job);
  }
  if (sqlite3_step(s.get()) != SQLITE_ROW) return Error("counting samples");
  return s.UInt(0);
}

Result<std::vector<ReceivedSample>> HistoryStore::Samples(const SampleFilter& filter,
                                                          std::size_t limit) {
  Result<sqlite3_stmt*> p = Prepare(
      "SELECT received_us, run, job, architecture, pid, rank, device_uuid, device_index, step, "
      "time_us, reserved_bytes, allocated_bytes, active_bytes, requested_bytes, "
      "peak_reserved_bytes, peak_allocated_bytes, num_alloc_retries, num_ooms, "
      "cached_free_bytes, largest_free_block, max_allocatable, stranded_bytes, "
      "fragmentation_ratio, forecast_level, steps_to_oom, free_blocks, largest_request_bytes "
      "FROM samples "
      "WHERE (?1 = '' OR run = ?1) AND (?2 = '' OR job = ?2) ORDER BY id LIMIT ?3");
  if (!p.ok()) return p.status();
  Stmt s(*p);
  s.Bind(1, filter.run);
  s.Bind(2, filter.job);
  s.Bind(3, limit == 0 ? std::int64_t{-1} : static_cast<std::int64_t>(limit));
  std::vector<ReceivedSample> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    ReceivedSample rs;
    agent::AgentSample& a = rs.sample;
    rs.received_us = s.Int(0);
    a.run = s.Text(1);
    a.job = s.Text(2);
    a.architecture = s.Text(3);
    a.pid = static_cast<std::uint32_t>(s.Int(4));
    a.rank = static_cast<std::int32_t>(s.Int(5));
    a.device_uuid = s.Text(6);
    a.device_index = static_cast<std::int32_t>(s.Int(7));
    a.step = s.Int(8);
    a.time_us = s.Int(9);
    a.reserved_bytes = s.UInt(10);
    a.allocated_bytes = s.UInt(11);
    a.active_bytes = s.UInt(12);
    a.requested_bytes = s.UInt(13);
    a.peak_reserved_bytes = s.UInt(14);
    a.peak_allocated_bytes = s.UInt(15);
    a.num_alloc_retries = s.UInt(16);
    a.num_ooms = s.UInt(17);
    a.cached_free_bytes = s.UInt(18);
    a.largest_free_block = s.UInt(19);
    a.max_allocatable = s.UInt(20);
    a.stranded_bytes = s.UInt(21);
    a.fragmentation_ratio = s.Real(22);
    const std::int64_t level = s.Int(23);
    if (level < 0 || level > static_cast<std::int64_t>(RiskLevel::kCritical)) {
      return Status::Corruption(
          fmt::format("{}: sample with an unknown forecast level {}", path_, level));
    }
    a.forecast_level = static_cast<RiskLevel>(level);
    if (!s.IsNull(24)) a.steps_to_oom = s.Int(24);
    FRAGSCOPE_RETURN_IF_ERROR(DecodeHistogram(s.Blob(25), &a).WithPrefix(path_));
    a.largest_request_bytes = s.UInt(26);
    out.push_back(std::move(rs));
  }
  if (rc != SQLITE_DONE) return Error("reading samples");
  return out;
}

}  // namespace fragscope::sinks
