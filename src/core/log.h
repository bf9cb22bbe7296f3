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
// log_debug(...), log_info(...), log_warn(...), log_error(...): log at one level.
template <LogLevel kLevel>
struct LogAt {
  template <class... Args>
  void operator()(fmt::format_string<Args...> f, Args&&... a) const {
    log(kLevel, f, std::forward<Args>(a)...);
  }
};
inline constexpr LogAt<LogLevel::debug> log_debug;
inline constexpr LogAt<LogLevel::info> log_info;
inline constexpr LogAt<LogLevel::warn> log_warn;
inline constexpr LogAt<LogLevel::error> log_error;

}  // namespace kiln
