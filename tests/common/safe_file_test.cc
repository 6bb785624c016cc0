// SafeFile (src/common/safe_file.h): issue 24 item 4, no writes through links.
#include "common/safe_file.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

namespace fragscope {
namespace {

namespace fs = std::filesystem;

class SafeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/safe_file_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }

  std::string dir_;
};

TEST_F(SafeFileTest, WritesThroughATemporaryAndRenames) {
  Write(Path("out"), "old");
  Result<std::unique_ptr<SafeFile>> f = SafeFile::Create(Path("out"), OutputOrigin::kNamedByUser);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->Write("new ").ok());
  ASSERT_TRUE((*f)->Write("content").ok());
  // Before the commit: the old file, and a dot temporary beside it.
  EXPECT_EQ(Read(Path("out")), "old");
  const std::string temp = fs::path((*f)->temp_path()).filename();
  EXPECT_EQ(temp.rfind(".out.", 0), 0u) << temp;
  EXPECT_EQ(temp.substr(temp.size() - 4), ".tmp");
  EXPECT_EQ(Names().size(), 2u);
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(Read(Path("out")), "new content");
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});
}

TEST_F(SafeFileTest, AnUncommittedFileLeavesNothing) {
  {
    Result<std::unique_ptr<SafeFile>> f =
        SafeFile::Create(Path("out"), OutputOrigin::kChosenByTool);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Write("half").ok());
  }
  EXPECT_TRUE(Names().empty());
}

TEST_F(SafeFileTest, Issue24LinkAtAPathTheToolChoseIsRefused) {
  Write(Path("victim"), "untouched");
  fs::create_symlink("victim", Path("fragscope.prom"));
  Status s = WriteFileSafely(Path("fragscope.prom"), "metrics", OutputOrigin::kChosenByTool);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fragscope.prom: is a symbolic link (to victim)"), std::string::npos)
      << s.message();
  EXPECT_EQ(Read(Path("victim")), "untouched");
  EXPECT_TRUE(fs::is_symlink(Path("fragscope.prom")));
  EXPECT_EQ(Names(), (std::vector<std::string>{"fragscope.prom", "victim"}));
}

TEST_F(SafeFileTest, Issue24LinkTheUserNamedIsFollowedToItsFile) {
  fs::create_directory(Path("elsewhere"));
  Write(Path("elsewhere/real.json"), "old");
  fs::create_symlink("elsewhere/real.json", Path("out.json"));
  Result<std::unique_ptr<SafeFile>> f =
      SafeFile::Create(Path("out.json"), OutputOrigin::kNamedByUser);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  // The temporary is made beside the file the link points to, so the rename stays in one
  // directory (and one file system).
  EXPECT_EQ(fs::path((*f)->temp_path()).parent_path(), fs::canonical(Path("elsewhere")));
  ASSERT_TRUE((*f)->Write("new").ok());
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_TRUE(fs::is_symlink(Path("out.json")));
  EXPECT_EQ(Read(Path("elsewhere/real.json")), "new");
}

TEST_F(SafeFileTest, Issue24ALinkToNothingIsNeverFollowed) {
  fs::create_symlink("created-by-us", Path("out.json"));
  for (OutputOrigin origin : {OutputOrigin::kNamedByUser, OutputOrigin::kChosenByTool}) {
    Status s = WriteFileSafely(Path("out.json"), "x", origin);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(fs::exists(Path("created-by-us")));
  EXPECT_EQ(Names(), std::vector<std::string>{"out.json"});
}

TEST_F(SafeFileTest, SomethingElseThanARegularFileIsRefused) {
  fs::create_directory(Path("d"));
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  for (const char* name : {"d", "fifo"}) {
    Status s = WriteFileSafely(Path(name), "x", OutputOrigin::kNamedByUser);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find("refusing to replace it"), std::string::npos) << s.message();
  }
  EXPECT_EQ(Names(), (std::vector<std::string>{"d", "fifo"}));
}

TEST_F(SafeFileTest, MissingDirectoryIsNotFound) {
  Status s = WriteFileSafely(Path("no/such/out"), "x", OutputOrigin::kNamedByUser);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no such directory"), std::string::npos) << s.message();
}

TEST_F(SafeFileTest, RefuseLinkOrSpecial) {
  EXPECT_TRUE(RefuseLinkOrSpecial(Path("absent"), "history").ok());
  Write(Path("file"), "");
  EXPECT_TRUE(RefuseLinkOrSpecial(Path("file"), "history").ok());
  fs::create_symlink("file", Path("link"));
  Status s = RefuseLinkOrSpecial(Path("link"), "history");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "history " + Path("link") + ": is a symbolic link (to file)");
}

// A process killed by SIGTERM (or SIGINT, SIGHUP) in the middle of a write leaves no temporary:
// the handler SafeFile installs removes it, then the process dies of the signal.
TEST_F(SafeFileTest, Issue24TemporaryIsRemovedOnSigterm) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      Result<std::unique_ptr<SafeFile>> f =
          SafeFile::Create(Path("out"), OutputOrigin::kNamedByUser);
      if (!f.ok() || !(*f)->Write("partial").ok()) ::_exit(3);
      ::raise(sig);
      ::_exit(4);  // not reached: the signal ends the process
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_TRUE(Names().empty()) << Names().front();
  }
}

}  // namespace
}  // namespace fragscope
