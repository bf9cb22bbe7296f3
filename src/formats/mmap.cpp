#include "formats/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>

#include "formats/output_file.h"

namespace kiln {

namespace {

// The live maps, for the SIGBUS handler: a fixed table that it reads without locks or allocation. A map that
// finds no free entry (more than kMapSlots files mapped at once) faults with the default action.
constexpr int kMapSlots = 64;
constexpr size_t kMapPathMax = 1024;
std::atomic<bool> g_taken[kMapSlots];
std::atomic<uintptr_t> g_lo[kMapSlots], g_hi[kMapSlots];  // [lo, hi); both 0 while the entry is not live
char g_paths[kMapSlots][kMapPathMax];

int map_acquire(const void* p, size_t n, const std::string& path) {
  for (int i = 0; i < kMapSlots; ++i) {
    bool expected = false;
    if (!g_taken[i].compare_exchange_strong(expected, true)) continue;
    const size_t len = std::min(path.size(), kMapPathMax - 1);  // a longer path is cut short in the message
    std::memcpy(g_paths[i], path.data(), len);
    g_paths[i][len] = '\0';
    const auto lo = reinterpret_cast<uintptr_t>(p);
    g_hi[i].store(lo + n, std::memory_order_release);
    g_lo[i].store(lo, std::memory_order_release);
    return i;
  }
  return -1;
}

void map_release(int slot) {
  if (slot < 0) return;
  g_lo[slot].store(0, std::memory_order_release);
  g_hi[slot].store(0, std::memory_order_release);
  g_taken[slot].store(false, std::memory_order_release);
}

// Async-signal-safe output: write(2) of a string, of a decimal number.
void put(const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void put_number(uint64_t v) {
  char buf[24];
  char* p = buf + sizeof(buf);
  *--p = '\0';
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  put(p);
}

extern "C" void mapped_file_fault(int sig, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kMapSlots; ++i) {
    const uintptr_t lo = g_lo[i].load(std::memory_order_acquire), hi = g_hi[i].load(std::memory_order_acquire);
    if (lo == 0 || addr < lo || addr >= hi) continue;
    put("kiln: ");
    put(g_paths[i]);
    put(" changed on disk while in use: its byte ");
    put_number(addr - lo);
    put(" is gone (the file was truncated or rewritten in place); stopping. Replace a model file that is in "
        "use by writing a new file and renaming it over the old one.\n");
    remove_unfinished_outputs();
    ::_exit(1);
  }
  std::signal(sig, SIG_DFL);  // not a map of ours: the default action (a core dump) when the handler returns
}

}  // namespace

void install_mapped_file_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = mapped_file_fault;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, nullptr);
}

Result<MappedFile> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO or a device in place of a model file is refused below instead of blocking open().
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("file not found: {}", path);
    return io_error("cannot open {}: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("{} is not a regular file", path);
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return io_error("cannot mmap {} ({} bytes): {}", path, f.size_, std::strerror(err));
    }
    f.data_ = static_cast<const uint8_t*>(p);
    f.slot_ = map_acquire(p, f.size_, path);
  }
  ::close(fd);
  return f;
}

void MappedFile::drop_pages(const void* p, size_t n) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  if (data_ == nullptr || page == 0 || lo < base || hi > base + size_) return;
  const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
  // The map is shared and read-only: dropping a page loses nothing (a later read faults it in from the file).
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)),
      slot_(std::exchange(other.slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    map_release(std::exchange(slot_, -1));  // before the unmap: the range may be mapped again at once
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

MappedFile::~MappedFile() {
  map_release(slot_);
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kiln
