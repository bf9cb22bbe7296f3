// Output files that never destroy what was there (formats/output_file.h), folders that are never left through
// a link (formats/folder.h), and model paths that are not regular files (formats/mmap.h).
#include "formats/output_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "formats/folder.h"
#include "formats/gguf.h"
#include "formats/mmap.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A fresh empty folder under the test temp dir, removed at the end of the test.
class Scratch : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("kiln_{}_{}_{}", info->name(), getpid(), counter_++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static void write(const std::string& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }
  size_t n_entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {})); }

  fs::path dir_;
  static inline int counter_ = 0;
};

using OutputFileTest = Scratch;

TEST_F(OutputFileTest, CommitReplacesOnlyWhenComplete) {
  write(path("out"), "old");
  {
    auto f = OutputFile::create(path("out"));
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    std::fputs("new", f->stream());
    EXPECT_EQ(read(path("out")), "old");  // untouched until commit
    ASSERT_TRUE(f->commit().ok());
  }
  EXPECT_EQ(read(path("out")), "new");
  EXPECT_EQ(n_entries(), 1u);  // no temporary file left
  struct stat st {};
  ASSERT_EQ(::stat(path("out").c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask);  // the permissions of any new file, not mkstemp's 0600
}

TEST_F(OutputFileTest, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
  write(path("out"), "old");
  {
    auto f = OutputFile::create(path("out"));
    ASSERT_TRUE(f.ok());
    std::fputs("half", f->stream());
  }  // destroyed without commit: a failed conversion
  EXPECT_EQ(read(path("out")), "old");
  EXPECT_EQ(n_entries(), 1u);
}

TEST_F(OutputFileTest, TemporaryNamesAreFreshAndExclusive) {
  auto a = OutputFile::create(path("out"));
  auto b = OutputFile::create(path("out"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->temp_path(), b->temp_path());
  EXPECT_EQ(fs::path(a->temp_path()).parent_path(), dir_);  // beside the output: rename never crosses devices
}

TEST_F(OutputFileTest, PlantedLinksAreNeverWrittenThrough) {
  // The old writer used OUT.tmp.<pid>: a link planted at that name redirected the write to its target.
  write(path("victim"), "precious");
  fs::create_symlink(path("victim"), path(fmt::format("out.gguf.tmp.{}", getpid())));
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("llama"));
  ASSERT_TRUE(w.write(path("out.gguf")).ok());
  EXPECT_EQ(read(path("victim")), "precious");
  EXPECT_TRUE(gguf::File::open(path("out.gguf")).ok());
}

TEST_F(OutputFileTest, OutputsThatAreNotRegularFilesAreRefused) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  write(path("target"), "precious");
  fs::create_symlink(path("target"), path("link"));
  fs::create_directory(path("folder"));
  const std::pair<const char*, const char*> cases[] = {
      {"fifo", "a FIFO"}, {"link", "a symbolic link"}, {"folder", "a directory"}};
  for (const auto& [name, kind] : cases) {
    const Status s = check_output_path(path(name));
    EXPECT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find(kind), std::string::npos) << s.message();
    EXPECT_FALSE(OutputFile::create(path(name)).ok()) << name;
  }
  EXPECT_FALSE(check_output_path("/dev/null").ok());
  EXPECT_EQ(read(path("target")), "precious");
  EXPECT_TRUE(check_output_path(path("new.gguf")).ok());
}

TEST_F(OutputFileTest, AnOutputThatIsAnInputIsRefused) {
  fs::create_directory(path("model"));
  write(path("model/model.safetensors"), "weights");
  fs::create_hard_link(path("model/model.safetensors"), path("hardlink.gguf"));
  for (const char* out : {"model/model.safetensors", "hardlink.gguf"}) {
    const Status s = check_output_not_input(path(out), path("model"));
    EXPECT_FALSE(s.ok()) << out;
    EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(check_output_not_input(path("model/new.gguf"), path("model")).ok());
  EXPECT_FALSE(check_output_not_input(path("model/model.safetensors"), path("model/model.safetensors")).ok());
}

TEST_F(OutputFileTest, ASignalRemovesTheTemporaryFile) {
  const std::string out = path("out.gguf");
  EXPECT_EXIT(
      {
        install_output_cleanup_handlers();
        auto f = OutputFile::create(out);
        if (!f.ok() || !fs::exists(f->temp_path())) std::_Exit(3);
        std::fputs("partial", f->stream());
        std::fflush(f->stream());
        std::raise(SIGTERM);
        std::_Exit(4);  // not reached: the handler ends the process with SIGTERM
      },
      ::testing::KilledBySignal(SIGTERM), "");
  EXPECT_EQ(n_entries(), 0u);  // neither the output nor a temporary file
}

using FolderTest = Scratch;

TEST_F(FolderTest, LinksLeavingTheFolderAreRefused) {
  fs::create_directory(path("model"));
  write(path("secret"), "id_rsa");
  write(path("model/config.json"), "{}");
  fs::create_symlink(path("secret"), path("model/chat_template.jinja"));
  fs::create_symlink("config.json", path("model/inside.json"));
  EXPECT_TRUE(check_in_folder(path("model"), path("model/config.json")).ok());
  EXPECT_TRUE(check_in_folder(path("model"), path("model/inside.json")).ok());
  EXPECT_TRUE(check_in_folder(path("model"), path("model/missing.json")).ok());  // reported missing elsewhere
  const Status s = check_in_folder(path("model"), path("model/chat_template.jinja"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("chat_template.jinja"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("outside the model folder"), std::string::npos) << s.message();
}

TEST_F(FolderTest, HubCacheSnapshotsMayLinkToTheirBlobs) {
  fs::create_directories(path("models--org--m/snapshots/abc"));
  fs::create_directories(path("models--org--m/blobs"));
  write(path("models--org--m/blobs/123"), "{}");
  write(path("secret"), "x");
  fs::create_symlink("../../blobs/123", path("models--org--m/snapshots/abc/config.json"));
  fs::create_symlink(path("secret"), path("models--org--m/snapshots/abc/tokenizer.json"));
  const std::string snap = path("models--org--m/snapshots/abc");
  EXPECT_TRUE(check_in_folder(snap, snap + "/config.json").ok());
  EXPECT_FALSE(check_in_folder(snap, snap + "/tokenizer.json").ok());
}

using MappedFileTest = Scratch;

TEST_F(MappedFileTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(path("model.gguf").c_str(), 0600), 0);
  auto m = MappedFile::open(path("model.gguf"));  // blocked forever in open() before O_NONBLOCK
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("not a regular file"), std::string::npos) << m.status().message();
  EXPECT_FALSE(gguf::File::open(path("model.gguf")).ok());
}

// A mapped file cut short while in use: reading its lost bytes ends the process with status 1 and a line
// naming the file (install_mapped_file_fault_handler), not with SIGBUS; and an unfinished output file goes
// with it. The maps opened and closed before it (more than the handler's table holds at once) have given their
// entries back.
TEST_F(MappedFileTest, AFileCutShortWhileMappedIsAnErrorNamingIt) {
  const std::string model = path("model.gguf"), out = path("out.gguf");
  write(model, std::string(3 * 4096, 'w'));
  EXPECT_EXIT(
      {
        install_mapped_file_fault_handler();
        for (int i = 0; i < 100; ++i) {
          if (!MappedFile::open(model).ok()) std::_Exit(3);
        }
        auto m = MappedFile::open(model);
        auto f = OutputFile::create(out);
        if (!m.ok() || !f.ok() || ::truncate(model.c_str(), 0) != 0) std::_Exit(4);
        const volatile uint8_t* p = m->data();
        std::printf("%d\n", p[2 * 4096]);  // faults: the page is past the file's end now
        std::_Exit(5);
      },
      ::testing::ExitedWithCode(1), "model.gguf changed on disk while in use: its byte 8192 is gone");
  EXPECT_EQ(n_entries(), 1u);  // the model file alone: no temporary output file left
}

}  // namespace
}  // namespace kiln
