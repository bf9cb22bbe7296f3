#include "core/status.h"

namespace kiln {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_found: return "not_found";
    case StatusCode::out_of_range: return "out_of_range";
    case StatusCode::unimplemented: return "unimplemented";
    case StatusCode::io_error: return "io_error";
    case StatusCode::resource_exhausted: return "resource_exhausted";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", status_code_name(code_), message_);
}

}  // namespace kiln
