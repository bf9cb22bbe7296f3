#include "server/tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>

namespace kiln::server {

namespace {

// A call's syntax before its arguments is at most this long (a longer one is not taken as a call), and so is
// its closing markup.
constexpr size_t kMaxHeaderBytes = 1024;
constexpr size_t kMaxTrailerBytes = 4096;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Text that may open a call.
struct Marker {
  std::string_view text;
  bool part_of_call;         // the marker is the call's first byte ('{' or '['), not markup before it
  bool first_only;           // only before any content or call
  std::string_view closing;  // what follows the call object (hermes)
};

std::span<const Marker> markers(ToolCallFormat f) {
  // Small Qwen models also write a Hermes call as a fenced JSON block, or bare (llama.cpp reads both too).
  static constexpr Marker kHermes[] = {{"<tool_call>", false, false, "</tool_call>"},
                                       {"```json", false, false, "```"},
                                       {"```", false, false, "```"},
                                       {"{", true, true, ""}};
  static constexpr Marker kLlama3[] = {{"<|python_tag|>", false, true, ""}, {"{", true, true, ""}};
  static constexpr Marker kMistral[] = {{"[TOOL_CALLS]", false, false, ""}, {"[", true, true, ""}};
  switch (f) {
    case ToolCallFormat::hermes: return kHermes;
    case ToolCallFormat::llama3: return kLlama3;
    case ToolCallFormat::mistral: return kMistral;
    case ToolCallFormat::none: break;
  }
  return {};
}

// Matching a prefix of text against a piece of syntax: the text so far may still become it (more), cannot
// (fail), or holds it whole (done).
enum class Match { more, fail, done };

#define KILN_MATCH(expr)              \
  do {                                \
    const Match m_ = (expr);          \
    if (m_ != Match::done) return m_; \
  } while (false)

struct Cursor {
  std::string_view s;
  size_t i = 0;

  void ws() {
    while (i < s.size() && is_ws(s[i])) ++i;
  }
  Match lit(std::string_view want) {
    const size_t n = std::min(want.size(), s.size() - i);
    if (s.substr(i, n) != want.substr(0, n)) return Match::fail;
    i += n;
    return n == want.size() ? Match::done : Match::more;
  }
  // A JSON string, decoded into `out`.
  Match string(std::string& out) {
    KILN_MATCH(lit("\""));
    const size_t from = i - 1;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (static_cast<unsigned char>(c) < 0x20) return Match::fail;
      if (c == '\\') {
        ++i;  // the escaped byte (its validity is the parser's below)
      } else if (c == '"') {
        ++i;
        const auto j = nlohmann::json::parse(s.substr(from, i - from), nullptr, /*allow_exceptions=*/false);
        if (!j.is_string()) return Match::fail;
        out = j.get<std::string>();
        return Match::done;
      }
    }
    return Match::more;
  }
};

// A call object up to its arguments' '{': `[`? `{` (`"type": "function",`)? `"name": STRING,`
// `"arguments"|"parameters": {`, whitespace free between the parts.
Match match_header(std::string_view s, bool list_open, std::string& name) {
  Cursor c{s};
  c.ws();
  if (list_open) {
    KILN_MATCH(c.lit("["));
    c.ws();
  }
  KILN_MATCH(c.lit("{"));
  c.ws();
  std::string key;
  KILN_MATCH(c.string(key));
  if (key == "type") {
    std::string type;
    c.ws();
    KILN_MATCH(c.lit(":"));
    c.ws();
    KILN_MATCH(c.string(type));
    if (type != "function") return Match::fail;
    c.ws();
    KILN_MATCH(c.lit(","));
    c.ws();
    KILN_MATCH(c.string(key));
  }
  if (key != "name") return Match::fail;
  c.ws();
  KILN_MATCH(c.lit(":"));
  c.ws();
  KILN_MATCH(c.string(name));
  c.ws();
  KILN_MATCH(c.lit(","));
  c.ws();
  KILN_MATCH(c.string(key));
  if (key != "arguments" && key != "parameters") return Match::fail;
  c.ws();
  KILN_MATCH(c.lit(":"));
  c.ws();
  return c.lit("{");
}

// A string, object or list, skipped.
Match skip_value(Cursor& c) {
  if (c.i == c.s.size()) return Match::more;
  std::string ignored;
  if (c.s[c.i] == '"') return c.string(ignored);
  JsonScanner j;
  if (c.s[c.i] == '{') {
    j.start_object();
  } else if (c.s[c.i] == '[') {
    j.start_list();
  } else {
    return Match::fail;
  }
  while (++c.i < c.s.size()) {
    const JsonScanner::Step r = j.feed(c.s[c.i]);
    if (r == JsonScanner::Step::error) return Match::fail;
    if (r == JsonScanner::Step::done) {
      ++c.i;
      return Match::done;
    }
  }
  return Match::more;
}

// After the arguments: (`, STRING: VALUE`)* `}` (keys the call does not need: Mistral's "id", or what a small
// model adds), then `closing` (hermes's `</tool_call>`).
Match match_trailer(std::string_view s, std::string_view closing) {
  Cursor c{s};
  c.ws();
  while (c.i < s.size() && s[c.i] == ',') {
    std::string ignored;
    ++c.i;
    c.ws();
    KILN_MATCH(c.string(ignored));
    c.ws();
    KILN_MATCH(c.lit(":"));
    c.ws();
    KILN_MATCH(skip_value(c));
    c.ws();
  }
  KILN_MATCH(c.lit("}"));
  if (closing.empty()) return Match::done;
  c.ws();
  return c.lit(closing);
}

#undef KILN_MATCH

}  // namespace

ToolCallFormat tool_call_format(std::string_view t) {
  const auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("[TOOL_CALLS]")) return ToolCallFormat::mistral;
  // Qwen3-Coder's <tool_call><function=...> is another syntax.
  if (has("<tool_call>") && !has("<function=")) return ToolCallFormat::hermes;
  if (has("<|start_header_id|>") && has("\"parameters\"")) return ToolCallFormat::llama3;
  return ToolCallFormat::none;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::hermes: return "hermes";
    case ToolCallFormat::llama3: return "llama3";
    case ToolCallFormat::mistral: return "mistral";
    case ToolCallFormat::none: break;
  }
  return "none";
}

ToolCallParser::ToolCallParser(ToolCallFormat format, std::vector<std::string> names, int32_t max_calls)
    : format_(format), names_(std::move(names)), max_calls_(max_calls) {}

bool ToolCallParser::known(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

void ToolCallParser::emit(ToolCallEvent::Kind kind, std::string_view text, std::vector<ToolCallEvent>& out) {
  if (kind == ToolCallEvent::Kind::content) {
    if (after_call_) {  // whitespace right after a call is not content
      while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
      after_call_ = text.empty();
    }
    if (text.empty()) return;
    any_content_ = true;
  }
  if (kind != ToolCallEvent::Kind::call && !out.empty() && out.back().kind == kind) {
    out.back().text += text;
  } else {
    out.push_back({kind, std::string(text)});
  }
}

void ToolCallParser::feed(std::string_view text, std::vector<ToolCallEvent>& out) {
  input_.assign(text);
  pos_ = 0;
  while (pos_ < input_.size()) step(input_[pos_++], out);
  input_.clear();
  pos_ = 0;
}

void ToolCallParser::finish(std::vector<ToolCallEvent>& out) {
  // A call begun but not taken is text; reading it again may begin another, which is decided the same way.
  while (state_ == State::header) {
    reject(held_, out);
    while (pos_ < input_.size()) step(input_[pos_++], out);
  }
  input_.clear();
  pos_ = 0;
  if (state_ == State::text && !held_.empty()) {
    const bool blank = std::all_of(held_.begin(), held_.end(), is_ws);
    if (!(blank && n_seen_ > 0)) emit(ToolCallEvent::Kind::content, held_, out);
  }
  // arguments: the call is cut where the output ended; trailer, between: closing markup, dropped.
  held_.clear();
  state_ = State::text;
}

void ToolCallParser::reject(std::string& held, std::vector<ToolCallEvent>& out) {
  // The first byte is content, and so is the whitespace before it: read again, it would begin the same
  // failed call.
  size_t n = 0;
  while (n < held.size() && is_ws(held[n])) ++n;
  n = std::min(n + 1, held.size());
  emit(ToolCallEvent::Kind::content, std::string_view(held).substr(0, n), out);
  input_.insert(pos_, held, n);
  held.clear();
  state_ = State::text;
}

void ToolCallParser::step(char c, std::vector<ToolCallEvent>& out) {
  switch (state_) {
    case State::text: return step_text(c, out);
    case State::header: return step_header(c, out);
    case State::arguments: {
      const JsonScanner::Step r = json_.feed(c);
      if (r == JsonScanner::Step::error) {  // the arguments end here; the rest is text
        state_ = State::text;
        --pos_;
        return;
      }
      if (reporting_) emit(ToolCallEvent::Kind::arguments, std::string_view(&c, 1), out);
      if (r == JsonScanner::Step::done) state_ = State::trailer;
      return;
    }
    case State::trailer: return step_trailer(c);
    case State::between: return step_between(c);
  }
}

void ToolCallParser::step_text(char c, std::vector<ToolCallEvent>& out) {
  held_ += c;
  for (;;) {
    size_t w = 0;
    while (w < held_.size() && is_ws(held_[w])) ++w;
    const std::string_view rest = std::string_view(held_).substr(w);
    if (rest.empty()) return;  // whitespace waits: it is not content if a call follows
    // A marker that is the start of a longer one (mistral's '[' and "[TOOL_CALLS]") waits for the longer.
    const Marker* found = nullptr;
    for (const Marker& m : markers(format_)) {
      if (m.first_only && (any_content_ || n_seen_ > 0)) continue;
      if (m.text.size() > rest.size() && m.text.starts_with(rest)) return;
      if (found == nullptr && rest.starts_with(m.text)) found = &m;
    }
    if (found != nullptr) {
      state_ = State::header;
      header_from_ = w + (found->part_of_call ? 0 : found->text.size());
      list_open_ = format_ == ToolCallFormat::mistral;
      closing_ = found->closing;
      return;  // held_ keeps the whitespace and the marker, given back if no call follows
    }
    emit(ToolCallEvent::Kind::content, std::string_view(held_).substr(0, w + 1), out);
    held_.erase(0, w + 1);
  }
}

void ToolCallParser::step_header(char c, std::vector<ToolCallEvent>& out) {
  held_ += c;
  std::string name;
  Match m = held_.size() - header_from_ > kMaxHeaderBytes
                ? Match::fail
                : match_header(std::string_view(held_).substr(header_from_), list_open_, name);
  if (m == Match::more) return;
  if (m == Match::done && !known(name)) m = Match::fail;
  if (m == Match::fail) return reject(held_, out);
  held_.clear();
  ++n_seen_;
  after_call_ = true;
  reporting_ = n_reported_ < max_calls_;
  if (reporting_) {
    ++n_reported_;
    emit(ToolCallEvent::Kind::call, name, out);
    emit(ToolCallEvent::Kind::arguments, "{", out);
  }
  json_.start_object();
  state_ = State::arguments;
}

void ToolCallParser::step_trailer(char c) {
  held_ += c;
  const Match m = held_.size() > kMaxTrailerBytes ? Match::fail : match_trailer(held_, closing_);
  if (m == Match::more) return;
  if (m == Match::fail) {  // malformed closing markup is text
    input_.insert(pos_, held_);
    held_.clear();
    state_ = State::text;
    return;
  }
  held_.clear();
  state_ = format_ == ToolCallFormat::hermes ? State::text : State::between;
}

void ToolCallParser::step_between(char c) {
  if (is_ws(c) || (c == ';' && format_ == ToolCallFormat::llama3)) return;
  if (c == '{' && format_ == ToolCallFormat::llama3) {
    held_ = "{";
  } else if (c == ',' && format_ == ToolCallFormat::mistral) {
    held_.clear();
  } else {
    if (!(c == ']' && format_ == ToolCallFormat::mistral)) --pos_;  // not a separator: text
    state_ = State::text;
    return;
  }
  header_from_ = 0;
  list_open_ = false;
  closing_ = {};
  state_ = State::header;
}

void merge_events(const std::vector<ToolCallEvent>& events, ParsedOutput& out) {
  for (const ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::content: out.content += e.text; break;
      case ToolCallEvent::Kind::call: out.calls.push_back({e.text, ""}); break;
      case ToolCallEvent::Kind::arguments:
        if (!out.calls.empty()) out.calls.back().arguments += e.text;
        break;
    }
  }
}

ParsedOutput parse_tool_calls(ToolCallFormat format, std::vector<std::string> names, std::string_view text,
                              int32_t max_calls) {
  ToolCallParser p(format, std::move(names), max_calls);
  std::vector<ToolCallEvent> events;
  p.feed(text, events);
  p.finish(events);
  ParsedOutput out;
  merge_events(events, out);
  return out;
}

}  // namespace kiln::server
