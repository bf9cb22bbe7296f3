// JsonScanner: whether bytes, fed one at a time, stay a prefix of one JSON value (RFC 8259; the bytes inside
// strings are not checked for UTF-8), and where that value ends. The tool call parser streams a call's
// arguments through it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::server {

class JsonScanner {
 public:
  enum class Step {
    more,   // the byte continues the value
    done,   // the byte ends the value (a container's closing bracket)
    error,  // the byte cannot continue it (start again before the next feed)
  };
  static constexpr size_t kMaxDepth = 256;  // nested containers: deeper is an error

  // Starts inside an object (or a list) whose '{' (or '[') was just read.
  void start_object();
  void start_list();
  Step feed(char c);

 private:
  enum class S : uint8_t {
    key_or_end,
    key,
    colon,
    value,
    value_or_end,
    after_value,
    string,
    escape,
    hex,
    number,
    literal
  };
  enum class N : uint8_t { minus, zero, integer, dot, fraction, exp, exp_sign, exp_digits };
  Step close(char c);
  Step begin_value(char c);
  bool number_step(char c);  // c continues the number

  std::string stack_;  // '{' or '[' per open container, innermost last
  S state_ = S::value;
  N num_ = N::integer;
  bool key_ = false;          // the string being read is an object's key
  int hex_left_ = 0;          // \uXXXX digits still to come
  std::string_view literal_;  // the rest of true / false / null
};

}  // namespace kiln::server
