// A read-only memory map of a whole file. Model weights are used in place from it.
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
};

}  // namespace kiln
