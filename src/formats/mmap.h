// A read-only memory map of a whole file. Model weights are used in place from it.
//
// A file truncated (or rewritten in place) while it is mapped makes a read of its lost bytes fault (SIGBUS),
// as with any mapped file. install_mapped_file_fault_handler() turns that fault into a one-line error naming
// the file, then ends the process with status 1 (nothing can go on once the weights it was reading are gone),
// removing unfinished output files first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace kiln {

class MappedFile {
 public:
  // Maps `path` read-only. Errors: missing file, a directory, unreadable, mmap failure.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hands the whole pages within [p, p + n) back to the page cache: they leave this process's resident set
  // and are read again from the file if touched. For bytes a backend has copied (a repacked or device copy).
  void drop_pages(const void* p, size_t n) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  int slot_ = -1;  // its entry in the fault handler's table (-1: none)
};

// Installs the SIGBUS handler described above; a fault outside every live map keeps the default action.
// Call once from a program's main.
void install_mapped_file_fault_handler();

}  // namespace kiln
