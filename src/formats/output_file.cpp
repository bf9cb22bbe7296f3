#include "formats/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <utility>

namespace kiln {

namespace {

namespace fs = std::filesystem;

// Temporary files a signal handler must remove: a fixed table, so that the handler only reads memory and
// calls unlink (async-signal-safe). A path that does not fit, or a 17th live file, is simply not cleaned on a
// signal.
constexpr int kSlots = 16;
constexpr size_t kPathMax = 4096;
std::atomic<bool> g_taken[kSlots];  // a slot is owned by one OutputFile
std::atomic<bool> g_live[kSlots];   // its path is written and the file exists
char g_paths[kSlots][kPathMax];

int cleanup_acquire(const std::string& path) {
  if (path.size() >= kPathMax) return -1;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (g_taken[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
      g_live[i].store(true, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void cleanup_release(int slot) {
  if (slot < 0) return;
  g_live[slot].store(false, std::memory_order_release);
  g_taken[slot].store(false, std::memory_order_release);
}

extern "C" void output_cleanup_on_signal(int sig) {
  remove_unfinished_outputs();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Status check_output_path(const std::string& output) {
  if (output.empty()) return invalid_argument("no output file given");
  struct stat st {};
  if (::lstat(output.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return io_error("cannot check the output '{}': {}", output, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument(
        "the output '{}' exists and is {}: refusing to replace it (give a regular file path)", output,
        file_kind(st.st_mode));
  }
  return {};
}

Status check_output_not_input(const std::string& output, const std::string& input) {
  struct stat out {};
  if (::stat(output.c_str(), &out) != 0) return {};  // does not exist yet: it cannot be an input
  auto same = [&out](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino;
  };
  if (same(input)) return invalid_argument("the output '{}' is the input '{}'", output, input);
  std::error_code ec;
  if (fs::is_directory(input, ec)) {
    for (const auto& entry : fs::directory_iterator(input, ec)) {
      if (same(entry.path().string())) {
        return invalid_argument("the output '{}' is the input file '{}': it would be destroyed", output,
                                entry.path().string());
      }
    }
    if (ec) return io_error("cannot list the input folder '{}': {}", input, ec.message());
  }
  return {};
}

Result<OutputFile> OutputFile::create(const std::string& path) {
  KILN_TRY(check_output_path(path));
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::string templ = (dir / (p.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(templ.data());  // O_CREAT | O_EXCL, mode 0600, a random suffix
  if (fd < 0)
    return io_error("cannot create a temporary file in '{}': {}", dir.string(), std::strerror(errno));
  OutputFile f;
  f.path_ = path;
  f.temp_ = templ;
  f.slot_ = cleanup_acquire(templ);
  f.stream_ = ::fdopen(fd, "wb");
  if (f.stream_ == nullptr) {
    const int err = errno;
    ::close(fd);
    f.discard();
    return io_error("cannot open '{}' for writing: {}", templ, std::strerror(err));
  }
  return f;
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      temp_(std::move(other.temp_)),
      stream_(std::exchange(other.stream_, nullptr)),
      slot_(std::exchange(other.slot_, -1)) {
  other.temp_.clear();
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() {
  if (stream_ != nullptr) std::fclose(std::exchange(stream_, nullptr));
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  cleanup_release(std::exchange(slot_, -1));
}

Status OutputFile::commit() {
  KILN_ASSERT(stream_ != nullptr);
  const int fd = ::fileno(stream_);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  bool ok = std::fflush(stream_) == 0 && ::fchmod(fd, 0666 & ~mask) == 0 && ::fsync(fd) == 0;
  ok = std::fclose(std::exchange(stream_, nullptr)) == 0 && ok;
  if (!ok) {
    const int err = errno;
    discard();
    return io_error("writing '{}' failed: {}", path_, std::strerror(err));
  }
  // Released before the rename: a signal in between leaves the complete temporary file, never removes
  // `path_`.
  cleanup_release(std::exchange(slot_, -1));
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    return io_error("renaming the finished temporary file to '{}' failed: {}", path_, std::strerror(err));
  }
  temp_.clear();
  return {};
}

void remove_unfinished_outputs() {
  for (int i = 0; i < kSlots; ++i) {
    if (g_live[i].load(std::memory_order_acquire)) ::unlink(g_paths[i]);
  }
}

void install_output_cleanup_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction sa {};
    sa.sa_handler = output_cleanup_on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace kiln
