// What the C++ benchmarks share: aborting on a failed backend call, and comma-separated list arguments.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace kiln::bench {

// Aborts with the failed call's message: a benchmark has no error path worth more than that.
template <class T>
T check(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, r.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}
inline void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

// A comma-separated list after `flag` in argv, or `fallback` (an empty list when the argument is "").
inline std::vector<std::string> list_arg(int argc, char** argv, std::string_view flag,
                                         std::vector<std::string> fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (flag != argv[i]) continue;
    std::vector<std::string> out;
    std::string item;
    for (const char* c = argv[i + 1];; ++c) {
      if (*c == ',' || *c == '\0') {
        if (!item.empty()) out.push_back(item);
        item.clear();
        if (*c == '\0') break;
      } else {
        item += *c;
      }
    }
    return out;
  }
  return fallback;
}

}  // namespace kiln::bench
