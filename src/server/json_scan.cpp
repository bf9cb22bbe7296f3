#include "server/json_scan.h"

namespace kiln::server {

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

void JsonScanner::start_object() {
  stack_.assign(1, '{');
  state_ = S::key_or_end;
}

void JsonScanner::start_list() {
  stack_.assign(1, '[');
  state_ = S::value_or_end;
}

JsonScanner::Step JsonScanner::feed(char c) {
  switch (state_) {  // inside a token: whitespace is not free here
    case S::string:
      if (c == '"') {
        state_ = key_ ? S::colon : S::after_value;
      } else if (c == '\\') {
        state_ = S::escape;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return Step::error;
      }
      return Step::more;
    case S::escape:
      if (c == 'u') {
        state_ = S::hex;
        hex_left_ = 4;
        return Step::more;
      }
      if (std::string_view("\"\\/bfnrt").find(c) == std::string_view::npos) return Step::error;
      state_ = S::string;
      return Step::more;
    case S::hex:
      if (!is_hex(c)) return Step::error;
      if (--hex_left_ == 0) state_ = S::string;
      return Step::more;
    case S::literal:
      if (c != literal_.front()) return Step::error;
      literal_.remove_prefix(1);
      if (literal_.empty()) state_ = S::after_value;
      return Step::more;
    case S::number:
      if (number_step(c)) return Step::more;
      if (num_ != N::zero && num_ != N::integer && num_ != N::fraction && num_ != N::exp_digits) {
        return Step::error;
      }
      state_ = S::after_value;  // c ends the number and is read after it
      break;
    default: break;
  }
  if (is_ws(c)) return Step::more;
  switch (state_) {
    case S::key_or_end:
      if (c == '}') return close(c);
      [[fallthrough]];
    case S::key:
      if (c != '"') return Step::error;
      key_ = true;
      state_ = S::string;
      return Step::more;
    case S::colon:
      if (c != ':') return Step::error;
      state_ = S::value;
      return Step::more;
    case S::value_or_end:
      if (c == ']') return close(c);
      [[fallthrough]];
    case S::value: return begin_value(c);
    case S::after_value:
      if (c == ',') {
        state_ = stack_.back() == '{' ? S::key : S::value;
        return Step::more;
      }
      if (c == '}' || c == ']') return close(c);
      return Step::error;
    default: return Step::error;
  }
}

JsonScanner::Step JsonScanner::close(char c) {
  if (stack_.empty() || (c == '}') != (stack_.back() == '{')) return Step::error;
  stack_.pop_back();
  state_ = S::after_value;
  return stack_.empty() ? Step::done : Step::more;
}

JsonScanner::Step JsonScanner::begin_value(char c) {
  key_ = false;
  switch (c) {
    case '"': state_ = S::string; return Step::more;
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return Step::error;
      stack_.push_back(c);
      state_ = c == '{' ? S::key_or_end : S::value_or_end;
      return Step::more;
    case 't': literal_ = "rue"; break;
    case 'f': literal_ = "alse"; break;
    case 'n': literal_ = "ull"; break;
    case '-':
      state_ = S::number;
      num_ = N::minus;
      return Step::more;
    default:
      if (!is_digit(c)) return Step::error;
      state_ = S::number;
      num_ = c == '0' ? N::zero : N::integer;
      return Step::more;
  }
  state_ = S::literal;
  return Step::more;
}

bool JsonScanner::number_step(char c) {
  const bool digit = is_digit(c);
  const bool exp = c == 'e' || c == 'E';
  switch (num_) {
    case N::minus:
      if (!digit) return false;
      num_ = c == '0' ? N::zero : N::integer;
      return true;
    case N::integer:
      if (digit) return true;
      [[fallthrough]];
    case N::zero:
      if (c == '.')
        num_ = N::dot;
      else if (exp)
        num_ = N::exp;
      else
        return false;
      return true;
    case N::dot:
      if (!digit) return false;
      num_ = N::fraction;
      return true;
    case N::fraction:
      if (digit) return true;
      if (!exp) return false;
      num_ = N::exp;
      return true;
    case N::exp:
      if (c == '+' || c == '-')
        num_ = N::exp_sign;
      else if (digit)
        num_ = N::exp_digits;
      else
        return false;
      return true;
    case N::exp_sign:
      if (!digit) return false;
      num_ = N::exp_digits;
      return true;
    case N::exp_digits: return digit;
  }
  return false;
}

}  // namespace kiln::server
