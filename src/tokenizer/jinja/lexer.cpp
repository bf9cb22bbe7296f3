// Template source -> tokens, with Hugging Face's environment: trim_blocks=True, lstrip_blocks=True.
#include <cstring>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/strutil.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  Result<std::vector<Token>> run() {
    while (pos_ < src_.size()) {
      size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_text(std::move(text), pos_);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      bool segment_at_line_start = pos_ == 0 || src_[pos_ - 1] == '\n';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        lstrip_block(text, segment_at_line_start);
      }
      emit_text(std::move(text), pos_);
      pos_ = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        KILN_TRY(comment(start));
      } else {
        KILN_TRY(tag(kind, start));
      }
    }
    push(Tok::eof, "", pos_);
    return std::move(toks_);
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t p = from; p + 1 < src_.size(); ++p) {
      if (src_[p] == '{' && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return src_.size();
  }

  // lstrip_blocks: spaces and tabs between the line start and a block tag are removed.
  static void lstrip_block(std::string& text, bool at_line_start) {
    size_t k = text.size();
    while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
    if ((k == 0 && at_line_start) || (k > 0 && text[k - 1] == '\n')) text.resize(k);
  }

  void emit_text(std::string text, size_t at) {
    if (strip_next_) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
      strip_next_ = false;
    } else if (trim_next_ && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    }
    trim_next_ = false;
    if (!text.empty()) push(Tok::text, std::move(text), at);
  }

  void position(size_t at, int& line, int& col) const {
    // Lines are counted incrementally: tokens are produced in source order.
    while (line_pos_ < at && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
      ++line_pos_;
    }
    line = line_;
    col = col_;
  }

  Token& push(Tok t, std::string text, size_t at) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    position(at, tok.line, tok.col);
    toks_.push_back(std::move(tok));
    return toks_.back();
  }

  Status error_at(size_t at, const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t k = 0; k < at && k < src_.size(); ++k) {
      if (src_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return invalid_argument("template line {}, column {}: {}", line, col, msg);
  }

  // After `{#`: skip to `#}`, honouring `-#}` and trim_blocks.
  Status comment(size_t start) {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return error_at(start, "unclosed comment '{#'");
    if (end > pos_ && src_[end - 1] == '-')
      strip_next_ = true;
    else
      trim_next_ = !(end > pos_ && src_[end - 1] == '+');
    pos_ = end + 2;
    return {};
  }

  Status tag(char kind, size_t start) {
    const bool block = kind == '%';
    const size_t first_tok = toks_.size();
    push(block ? Tok::block_begin : Tok::var_begin, "", start);
    size_t close_at = pos_;
    int depth = 0;  // brace depth: `}}` closes the tag only outside dict literals
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) return error_at(start, block ? "unclosed tag '{%'" : "unclosed tag '{{'");
      char c = src_[pos_];
      const char close = block ? '%' : '}';
      if (depth == 0 && (c == '-' || c == '+') && pos_ + 2 < src_.size() + 0 && src_[pos_ + 1] == close &&
          src_[pos_ + 2] == '}') {
        if (c == '-') strip_next_ = true;
        close_at = pos_;
        pos_ += 3;
        break;
      }
      if (depth == 0 && c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
        trim_next_ = block;
        close_at = pos_;
        pos_ += 2;
        break;
      }
      KILN_TRY(expr_token(depth));
    }
    push(block ? Tok::block_end : Tok::var_end, "", close_at);
    if (block && toks_.size() == first_tok + 3 && toks_[first_tok + 1].type == Tok::name &&
        toks_[first_tok + 1].text == "raw") {
      toks_.resize(first_tok);
      trim_next_ = false;  // Jinja applies trim_blocks after `{% endraw %}`, not after `{% raw %}`
      return raw(start);
    }
    return {};
  }

  // `{% raw %}...{% endraw %}`: the content is text.
  Status raw(size_t start) {
    for (size_t p = pos_; (p = src_.find("{%", p)) != std::string::npos; p += 2) {
      size_t q = p + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      bool strip_after = q < src_.size() && src_[q] == '-';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, p - pos_);
      if (strip_before) {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else {
        lstrip_block(text, false);
      }
      emit_text(std::move(text), pos_);
      pos_ = q + 2;
      strip_next_ = strip_after;
      trim_next_ = !strip_after;
      return {};
    }
    return error_at(start, "'{% raw %}' without '{% endraw %}'");
  }

  Status expr_token(int& depth) {
    const size_t at = pos_;
    const char c = src_[pos_];
    if (is_name_start(c)) {
      size_t e = pos_;
      while (e < src_.size() && (is_name_start(src_[e]) || is_digit(src_[e]))) ++e;
      push(Tok::name, src_.substr(pos_, e - pos_), at);
      pos_ = e;
      return {};
    }
    if (is_digit(c)) return number(at);
    if (c == '\'' || c == '"') return string_literal(at);
    static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                      ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
    for (const char* op : ops) {
      size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (n == 1 && c == '{') ++depth;
        if (n == 1 && c == '}') --depth;
        push(Tok::op, op, at);
        pos_ += n;
        return {};
      }
    }
    return error_at(at, std::string("unexpected character '") + c + "'");
  }

  Status number(size_t at) {
    size_t e = pos_;
    bool is_float = false;
    while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      ++e;
      while (e < src_.size() && (is_digit(src_[e]) || src_[e] == '_')) ++e;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        e = q;
        while (e < src_.size() && is_digit(src_[e])) ++e;
      }
    }
    std::string digits;
    for (size_t k = pos_; k < e; ++k) {
      if (src_[k] != '_') digits += src_[k];
    }
    Token& tok = push(is_float ? Tok::floating : Tok::integer, digits, at);
    if (is_float) {
      tok.fval = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(digits.c_str(), &end, 10);
      if (errno == ERANGE) return error_at(at, "integer literal " + digits + " does not fit in 64 bits");
      tok.ival = v;
    }
    pos_ = e;
    return {};
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python string literal escapes (Jinja decodes literals with "unicode-escape"); \x, \u and \U take hex
  // digits, an unknown escape stays as written.
  static constexpr CharEscape kStringEscapes[] = {{'n', "\n"}, {'t', "\t"}, {'r', "\r"},      {'\\', "\\"},
                                                  {'\'', "'"}, {'"', "\""}, {'a', "\a"},      {'b', "\b"},
                                                  {'f', "\f"}, {'v', "\v"}, {'0', {"\0", 1}}, {'\n', ""}};

  Status string_literal(size_t at) {
    const char quote = src_[pos_];
    std::string out;
    size_t p = pos_ + 1;
    for (;;) {
      if (p >= src_.size()) return error_at(at, "unterminated string literal");
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return error_at(at, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      if (const std::string_view* text = find_escape(kStringEscapes, e)) {
        out += *text;
      } else if (e == 'x' || e == 'u' || e == 'U') {
        int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          int h = p + size_t(k) < src_.size() ? hex_value(src_[p + size_t(k)]) : -1;
          if (h < 0) return error_at(at, std::string("bad \\") + e + " escape in string literal");
          cp = cp * 16 + uint32_t(h);
        }
        if (cp > 0x10FFFF) return error_at(at, "escape beyond U+10FFFF in string literal");
        unicode::utf8_append(out, cp);
        p += size_t(n);
      } else {
        out += '\\';
        out += e;
      }
    }
    push(Tok::string, std::move(out), at);
    pos_ = p + 1;
    return {};
  }

  const std::string& src_;
  size_t pos_ = 0;
  bool strip_next_ = false;  // the previous tag ended with `-`: strip the next text's leading whitespace
  bool trim_next_ = false;   // the previous tag was a block: drop one leading newline (trim_blocks)
  std::vector<Token> toks_;
  mutable size_t line_pos_ = 0;
  mutable int line_ = 1, col_ = 1;
};

}  // namespace

Result<std::vector<Token>> lex(const std::string& source) {
  // Jinja normalises newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      src += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      src += source[k];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(src).run();
}

}  // namespace kiln::jinja
