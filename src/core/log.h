// Logging to stderr. Generated text goes to stdout; everything else (logs, progress, speed) here.
#pragma once

#include <fmt/format.h>

#include <utility>

namespace kiln {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

// Default: info, or KILN_LOG_LEVEL=debug|info|warn|error|off.
LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, const std::string& line);

template <class... Args>
void log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) {
  log(LogLevel::debug, f, std::forward<Args>(a)...);
}
template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) {
  log(LogLevel::info, f, std::forward<Args>(a)...);
}
template <class... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) {
  log(LogLevel::warn, f, std::forward<Args>(a)...);
}
template <class... Args>
void log_error(fmt::format_string<Args...> f, Args&&... a) {
  log(LogLevel::error, f, std::forward<Args>(a)...);
}

}  // namespace kiln
