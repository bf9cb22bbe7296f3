// Writing an output file without ever destroying what was there by accident.
//
// Invariants (every writer of model files: convert, and later quantize / imatrix):
// - The destination, when it exists, is a regular file (never a device, FIFO, socket, directory or
//   symbolic link) and is not one of the command's inputs (same device and inode: hard links count).
// - The bytes go to a fresh temporary file in the destination's directory, created with O_CREAT|O_EXCL
//   under an unpredictable name (mkstemp), so a link planted there cannot redirect the write.
// - The destination is replaced (rename) only once the temporary file is complete and fsync'ed; on any
//   failure, or when the process is ended by SIGINT/SIGTERM/SIGHUP (install_output_cleanup_handlers), the
//   temporary file is removed.
#pragma once

#include <cstdio>
#include <string>

#include "core/status.h"

namespace kiln {

class OutputFile {
 public:
  // Checks the destination and creates the temporary file beside it.
  static Result<OutputFile> create(const std::string& path);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  ~OutputFile();  // not committed: the temporary file is closed and removed

  std::FILE* stream() const { return stream_; }
  const std::string& temp_path() const { return temp_; }
  // Flushes, fsyncs and closes the temporary file, gives it the permissions a new file gets (0666 & ~umask),
  // and renames it over the destination.
  Status commit();

 private:
  OutputFile() = default;
  void discard();

  std::string path_;             // the destination
  std::string temp_;             // the temporary file beside it
  std::FILE* stream_ = nullptr;  // open on temp_ until commit or discard
  int slot_ = -1;                // its entry in the signal-cleanup table
};

// An error when `output` exists and is not a regular file.
Status check_output_path(const std::string& output);

// An error when `output` exists and is the same file (device and inode) as `input` or, when `input` is a
// folder, as any file in it (symbolic links followed).
Status check_output_not_input(const std::string& output, const std::string& input);

// Installs SIGINT, SIGTERM and SIGHUP handlers that remove every temporary file of a live OutputFile, then
// end the process with the same signal. Call once from a program's main.
void install_output_cleanup_handlers();

// Removes every temporary file of a live OutputFile. Async-signal-safe: for a handler that ends the process
// (formats/mmap.h's).
void remove_unfinished_outputs();

}  // namespace kiln
