#include "formats/folder.h"

#include <filesystem>

namespace kiln {

namespace fs = std::filesystem;

Status check_in_folder(const std::string& dir, const std::string& file) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(file, ec))) return {};
  fs::path root = fs::canonical(dir.empty() ? "." : dir, ec);
  if (ec) return io_error("cannot resolve the folder '{}': {}", dir, ec.message());
  if (root.parent_path().filename() == "snapshots") root = root.parent_path().parent_path();
  const fs::path target = fs::canonical(file, ec);
  if (ec) return io_error("cannot resolve '{}': {}", file, ec.message());
  auto r = root.begin();
  auto t = target.begin();
  for (; r != root.end(); ++r, ++t) {
    if (t == target.end() || *r != *t) {
      return invalid_argument("'{}' is a link to '{}', outside the model folder '{}': refusing to read it",
                              file, target.string(), root.string());
    }
  }
  return {};
}

}  // namespace kiln
