#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kiln {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("KILN_LOG_LEVEL");
  if (env == nullptr) return LogLevel::info;
  if (std::strcmp(env, "debug") == 0) return LogLevel::debug;
  if (std::strcmp(env, "warn") == 0) return LogLevel::warn;
  if (std::strcmp(env, "error") == 0) return LogLevel::error;
  if (std::strcmp(env, "off") == 0) return LogLevel::off;
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
