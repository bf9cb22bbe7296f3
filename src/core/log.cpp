#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "core/env_options.h"

namespace kiln {
namespace {

LogLevel level_from_env() {
  const std::string& env = core_env_options().log_level;
  if (env == "debug") return LogLevel::debug;
  if (env == "warn") return LogLevel::warn;
  if (env == "error") return LogLevel::error;
  if (env == "off") return LogLevel::off;
  return LogLevel::info;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level, std::memory_order_relaxed); }

void log_write(LogLevel level, const std::string& line) {
  static std::mutex mu;
  static const char* const tags[] = {"debug", "info", "warn", "error", ""};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "kiln %s: %s\n", tags[static_cast<int>(level)], line.c_str());
}

}  // namespace kiln
