// Status and Result<T>: how runtime errors (bad files, bad requests, out of memory) travel in kiln.
// Programmer errors use KILN_ASSERT instead (abort with file:line). Never abort on bad input.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class StatusCode {
  ok = 0,
  invalid_argument,    // bad input: a malformed file, a bad request field
  not_found,           // a missing file, key or tensor
  out_of_range,        // an index or size beyond its limit
  unimplemented,       // a valid input that kiln does not support (yet): says what is missing
  io_error,            // the OS failed us: open, read, mmap, write
  resource_exhausted,  // out of memory, budgets (template steps, recursion)
  internal,            // a bug surfaced as an error instead of an abort
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: <message>"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

template <class... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::invalid_argument, f, std::forward<Args>(args)...);
}
template <class... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::not_found, f, std::forward<Args>(args)...);
}
template <class... Args>
Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::out_of_range, f, std::forward<Args>(args)...);
}
template <class... Args>
Status unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::unimplemented, f, std::forward<Args>(args)...);
}
template <class... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::io_error, f, std::forward<Args>(args)...);
}
template <class... Args>
Status resource_exhausted(fmt::format_string<Args...> f, Args&&... args) {
  return make_status(StatusCode::resource_exhausted, f, std::forward<Args>(args)...);
}

// Result<T>: a value or a non-ok Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) {
      std::fprintf(stderr, "kiln: Result constructed from an ok Status\n");
      std::abort();
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const& {
    static const Status ok_status;
    return ok() ? ok_status : std::get<Status>(v_);
  }
  // By value on a temporary, so `KILN_TRY(f().status())` never holds a reference into a destroyed Result.
  Status status() && { return ok() ? Status() : std::move(std::get<Status>(v_)); }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }

 private:
  T& checked() {
    if (!ok()) {
      std::fprintf(stderr, "kiln: value() of a failed Result: %s\n",
                   std::get<Status>(v_).to_string().c_str());
      std::abort();
    }
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

namespace detail {
inline Status to_status(const Status& s) { return s; }
template <class T>
Status to_status(const Result<T>& r) {
  return r.status();
}
}  // namespace detail

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Return the Status of `expr` (a Status or a Result) from the enclosing function when it is not ok.
#define KILN_TRY(expr)                                                    \
  do {                                                                    \
    auto&& kiln_try_v_ = (expr);                                          \
    if (!kiln_try_v_.ok()) return ::kiln::detail::to_status(kiln_try_v_); \
  } while (0)

// KILN_ASSIGN_OR_RETURN(auto x, f()): x = the value of f(), or return its Status.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_r_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// Programmer errors: abort with file:line and the failed condition.
#define KILN_ASSERT(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "kiln: assertion failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)
