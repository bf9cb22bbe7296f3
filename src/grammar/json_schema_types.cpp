// The rules of each JSON type (json_schema_converter.h). Objects, arrays and strings are written without
// whitespace; an object's properties come in the schema's order.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "grammar/gbnf_write.h"
#include "grammar/json_number.h"
#include "grammar/json_schema_converter.h"
#include "grammar/regex_syntax.h"
#include "tokenizer/unicode.h"

namespace kiln::grammar {

namespace {

// A date with the days of each month; February 29 only in leap years (divisible by 4, centuries by 400).
constexpr const char* kDate =
    R"((?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30))"
    R"(|02-(?:0[1-9]|1\d|2[0-8]))|(?:\d{2}(?:0[48]|[2468][048]|[13579][26]))"
    R"(|(?:0[048]|[2468][048]|[13579][26])00)-02-29))";
constexpr const char* kTime =
    R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
constexpr const char* kEmailLabel = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,22}[A-Za-z0-9])?)";

// The pattern (anchored) that the strings of a `format` follow, or nullopt for a format not supported.
std::optional<std::string> format_pattern(std::string_view format) {
  const std::string date = kDate, time = kTime, label = kEmailLabel;
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "T" + time + "$";
  if (format == "uuid")
    return R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)";
  // A bounded subset of the addresses RFC 5321 allows (up to three dot-separated atoms of 24 characters,
  // then up to three labels of 24 and a top-level domain of letters), so that a generated address always
  // ends: an unbounded one lets a small model repeat itself until max_tokens.
  if (format == "email")
    return R"(^[A-Za-z0-9_%+-]{1,24}(?:\.[A-Za-z0-9_%+-]{1,24}){0,2}@(?:)" + label +
           R"(\.){1,3}[A-Za-z]{2,12}$)";
  return std::nullopt;
}

const std::string kQuote = gbnf_literal("\"");
const std::string kComma = gbnf_literal(",");

Status with_pointer(const Status& s, const std::string& ptr) {
  return Status(s.code(), fmt::format("JSON schema: at {}: {}", ptr, s.message()));
}

// A bound keyword's text as a Decimal.
Result<Decimal> bound_value(const Json& v, const std::string& at) {
  if (!v.is_number()) return invalid_argument("JSON schema: {} is not a number", at);
  std::string text;
  if (v.is_number_unsigned()) {
    text = std::to_string(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    text = std::to_string(v.get<int64_t>());
  } else {
    if (!std::isfinite(v.get<double>())) return invalid_argument("JSON schema: {} is not finite", at);
    text = v.dump();
  }
  Result<Decimal> d = decimal_parse(text);
  if (!d.ok()) return with_pointer(d.status(), at);
  return d;
}

// The tighter of two bounds on one side (`lower`: the greater).
NumberBound tighter(const NumberBound& a, const NumberBound& b, bool lower) {
  if (!a.set) return b;
  if (!b.set) return a;
  const int c = decimal_compare(a.value, b.value);
  if (c == 0) return {true, a.value, a.exclusive || b.exclusive};
  return (c > 0) == lower ? a : b;
}

}  // namespace

Result<std::string> SchemaConverter::primitive(std::string_view kind) {
  if (auto it = primitives_.find(kind); it != primitives_.end()) return it->second;
  std::string body;
  if (kind == "char") {
    const CodeRanges raw =
        code_ranges_complement(code_ranges_normalize({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}}));
    const CodeRanges short_escapes = code_ranges_normalize(
        {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}});
    body = fmt::format("{} | {} ({} | \"u\" [0-9a-fA-F]{{4}})", gbnf_class(raw), gbnf_literal("\\"),
                       gbnf_class(short_escapes));
  } else if (kind == "key-char") {  // one spelling per character (json_escape_string's)
    body = regex_gbnf_expr(RegexNode{RegexNode::Kind::chars, {{0, kMaxCodePoint}}, {}, 0, 0}, true);
  } else if (kind == "string") {
    KILN_ASSIGN_OR_RETURN(const std::string c, primitive("char"));
    body = fmt::format("{} {}* {}", kQuote, c, kQuote);
  } else if (kind == "integer") {
    body = fmt::format("\"-\"? (\"0\" | [1-9] [0-9]{{0,{}}})", kNumberIntDigits - 1);
  } else if (kind == "number") {
    body = fmt::format(
        "\"-\"? (\"0\" | [1-9] [0-9]{{0,{}}}) (\".\" [0-9]{{1,{}}})? ([eE] (\"+\" | \"-\")? [0-9]{{1,3}})?",
        kNumberIntDigits - 1, kNumberFracDigits);
  } else if (kind == "boolean") {
    body = "\"true\" | \"false\"";
  } else if (kind == "null") {
    body = "\"null\"";
  } else if (kind == "value") {
    // The rule is named before its members are written: object and array refer back to it.
    const std::string name = new_name("value");
    primitives_.emplace(kind, name);
    std::vector<std::string> members;
    for (const char* k : {"object", "array", "string", "number", "boolean", "null"}) {
      KILN_ASSIGN_OR_RETURN(std::string m, primitive(k));
      members.push_back(std::move(m));
    }
    KILN_TRY(define(name, fmt::format("{}", fmt::join(members, " | "))));
    return name;
  } else if (kind == "object" || kind == "array") {
    const std::string name = new_name(std::string(kind));
    primitives_.emplace(kind, name);
    KILN_ASSIGN_OR_RETURN(const std::string value, primitive("value"));
    if (kind == "object") {
      KILN_ASSIGN_OR_RETURN(const std::string str, primitive("string"));
      const std::string kv = fmt::format("{} \":\" {}", str, value);
      KILN_TRY(define(name, fmt::format("\"{{\" ({} (\",\" {})*)? \"}}\"", kv, kv)));
    } else {
      KILN_TRY(define(name, fmt::format("\"[\" ({} (\",\" {})*)? \"]\"", value, value)));
    }
    return name;
  }
  KILN_ASSIGN_OR_RETURN(std::string name, rule(std::string(kind), body));
  primitives_.emplace(kind, name);
  return name;
}

Result<std::string> SchemaConverter::any_json(bool object_only) {
  return primitive(object_only ? "object" : "value");
}

Result<int64_t> SchemaConverter::count_keyword(const Json& s, const char* key, const std::string& ptr,
                                               int64_t fallback) const {
  if (!s.contains(key)) return fallback;
  const Json& v = s[key];
  const std::string at = pointer_append(ptr, key);
  const bool integral = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0) ||
                        (v.is_number_float() && v.get<double>() >= 0 && std::isfinite(v.get<double>()) &&
                         v.get<double>() == std::floor(v.get<double>()));
  if (!integral) return invalid_argument("JSON schema: {} at {} is not a non-negative integer", key, at);
  const double value = v.get<double>();
  if (value > static_cast<double>(limits_.max_repeat)) {
    return resource_exhausted("JSON schema: {} {} at {} is past the bound {} on repetition counts", key,
                              v.dump(), at, limits_.max_repeat);
  }
  return static_cast<int64_t>(value);
}

Result<std::string> SchemaConverter::visit_type(const std::string& type, const Json& s,
                                                const std::string& ptr, const std::string& hint, int depth) {
  if (type == "object") return visit_object(s, ptr, hint, depth);
  if (type == "array") return visit_array(s, ptr, hint, depth);
  if (type == "string") return visit_string(s, ptr, hint);
  if (type == "integer" || type == "number") return visit_number(s, ptr, hint, type == "integer");
  return primitive(type);  // null, boolean
}

// Any key but `names`: a trie of the names' code points; at each node the key may end (unless a name ends
// there), go on with a code point no name has next (then anything), or follow a name.
Result<std::string> SchemaConverter::key_not_in(const std::vector<std::string>& names,
                                                const std::string& hint) {
  struct Node {
    std::map<uint32_t, size_t> next;
    bool is_name = false;
  };
  std::vector<Node> trie(1);
  for (const auto& name : names) {
    size_t at = 0;
    for (size_t pos = 0; pos < name.size();) {
      uint32_t cp = 0;
      const size_t n = unicode::utf8_decode(name, pos, cp);
      if (n == 0) return invalid_argument("JSON schema: invalid UTF-8 in the property name '{}'", name);
      pos += n;
      auto it = trie[at].next.find(cp);
      if (it == trie[at].next.end()) {
        it = trie[at].next.emplace(cp, trie.size()).first;
        trie.emplace_back();
      }
      at = it->second;
    }
    trie[at].is_name = true;
  }
  KILN_ASSIGN_OR_RETURN(const std::string key_char, primitive("key-char"));
  // Each node as an expression for the rest of the key and its closing quote.
  auto write = [&](auto& self, size_t at, int depth) -> Result<std::string> {
    if (depth > 1000) return resource_exhausted("JSON schema: a property name longer than 1000 characters");
    const Node& node = trie[at];
    std::vector<std::string> alternatives;
    if (!node.is_name) alternatives.push_back(kQuote);
    if (node.next.empty()) {
      alternatives.push_back(fmt::format("{}+ {}", key_char, kQuote));
    } else {
      CodeRanges taken_next;
      for (const auto& [cp, child] : node.next) taken_next.emplace_back(cp, cp);
      const RegexNode other{
          RegexNode::Kind::chars, code_ranges_complement(code_ranges_normalize(taken_next)), {}, 0, 0};
      alternatives.push_back(fmt::format("{} {}* {}", regex_gbnf_expr(other, true), key_char, kQuote));
    }
    for (const auto& [cp, child] : node.next) {
      KILN_ASSIGN_OR_RETURN(const std::string rest, self(self, child, depth + 1));
      alternatives.push_back(fmt::format("{} {}", gbnf_literal(json_escape_code_point(cp)), rest));
    }
    return "(" + fmt::format("{}", fmt::join(alternatives, " | ")) + ")";
  };
  KILN_ASSIGN_OR_RETURN(const std::string rest, write(write, 0, 0));
  return rule(hint, kQuote + " " + rest);
}

Result<std::string> SchemaConverter::visit_object(const Json& s, const std::string& ptr,
                                                  const std::string& hint, int depth) {
  struct Prop {
    std::string name;
    const Json* schema;
    bool required;
  };
  static const Json kAny = true;
  if (s.contains("properties") && !s["properties"].is_object()) {
    return invalid_argument("JSON schema: properties at {} is not an object", ptr);
  }
  const Json* additional = s.contains("properties") ? nullptr : &kAny;  // no extra keys beside properties
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (!a.is_boolean() && !a.is_object()) {
      return invalid_argument("JSON schema: additionalProperties at {} is not a schema", ptr);
    }
    additional = (a.is_boolean() && !a.get<bool>()) ? nullptr : &a;
  }
  std::vector<std::string> required;
  if (s.contains("required")) {
    const Json& r = s["required"];
    if (!r.is_array() || !std::all_of(r.begin(), r.end(), [](const Json& x) { return x.is_string(); })) {
      return invalid_argument("JSON schema: required at {} is not a list of names", ptr);
    }
    for (const auto& x : r) required.push_back(x.get<std::string>());
  }
  const std::unordered_set<std::string> required_set(required.begin(), required.end());
  auto is_required = [&](const std::string& n) { return required_set.count(n) != 0; };
  std::vector<Prop> props;
  std::vector<std::string> declared;
  if (s.contains("properties")) {
    for (const auto& [name, schema] : s["properties"].items()) {
      props.push_back({name, &schema, is_required(name)});
      declared.push_back(name);
    }
  }
  std::unordered_set<std::string> declared_set(declared.begin(), declared.end());
  for (const auto& name : required) {
    if (!declared_set.insert(name).second) continue;
    if (additional == nullptr) {
      return invalid_argument(
          "JSON schema: the required property \"{}\" at {} is neither in properties nor allowed as an "
          "additional property",
          name, pointer_append(ptr, "required"));
    }
    props.push_back({name, additional, true});
    declared.push_back(name);
  }

  const PendingRefsCleared consumed(pending_refs_);  // after the "{", $ref cycles consume characters

  std::vector<std::string> kvs;
  std::vector<bool> req;
  for (const auto& p : props) {
    const std::string pptr =
        p.schema == additional ? ptr : pointer_append(pointer_append(ptr, "properties"), p.name);
    if (p.schema->is_boolean() && !p.schema->get<bool>()) {
      if (p.required)
        return invalid_argument("JSON schema: the required property at {} has the schema false", pptr);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(const std::string value,
                          visit(*p.schema, pptr, child_hint(hint, p.name), depth + 1));
    std::string key = "\"";
    if (!json_escape_string(p.name, key)) {
      return invalid_argument("JSON schema: invalid UTF-8 in a property name at {}", pptr);
    }
    kvs.push_back(gbnf_literal(key + "\":") + " " + value);
    req.push_back(p.required);
  }
  std::string extra;  // one additional key and value
  if (additional != nullptr) {
    KILN_ASSIGN_OR_RETURN(const std::string value,
                          visit(*additional, pointer_append(ptr, "additionalProperties"),
                                child_hint(hint, "additional"), depth + 1));
    std::string key;
    if (declared.empty()) {
      KILN_ASSIGN_OR_RETURN(key, primitive("string"));
    } else {
      KILN_ASSIGN_OR_RETURN(key, key_not_in(declared, child_hint(hint, "key")));
    }
    KILN_ASSIGN_OR_RETURN(extra, rule(child_hint(hint, "extra"), key + " \":\" " + value));
  }

  return object_rule(kvs, req, extra, hint);
}

Result<std::string> SchemaConverter::object_rule(const std::vector<std::string>& kvs,
                                                 const std::vector<bool>& req, const std::string& extra,
                                                 const std::string& hint) {
  // Properties in order, each optional one may be left out; then any number of additional ones.
  const size_t n = kvs.size();
  const size_t first_required = static_cast<size_t>(std::find(req.begin(), req.end(), true) - req.begin());
  const std::string extras_after = extra.empty() ? "" : "(" + kComma + " " + extra + ")*";
  std::vector<std::string> rest(n + 1);  // rest[k]: what follows once property k-1 is written
  rest[n] = extras_after;
  const bool use_rules = (first_required + 1) * n > 64;
  for (size_t k = n; k-- > 0;) {
    const std::string part = req[k] ? kComma + " " + kvs[k] : "(" + kComma + " " + kvs[k] + ")?";
    rest[k] = gbnf_seq(part, rest[k + 1]);
    if (use_rules && k > 0) {
      KILN_ASSIGN_OR_RETURN(rest[k], rule(child_hint(hint, "rest"), rest[k]));
    }
  }
  std::vector<std::string> starts;
  for (size_t j = 0; j < n && j <= first_required; ++j) starts.push_back(gbnf_seq(kvs[j], rest[j + 1]));
  if (first_required >= n && !extra.empty()) starts.push_back(gbnf_seq(extra, extras_after));
  std::string body;
  if (!starts.empty()) {
    body = "(" + fmt::format("{}", fmt::join(starts, " | ")) + ")";
    if (first_required >= n) body += "?";
  }
  return rule(hint, gbnf_seq(gbnf_seq(gbnf_literal("{"), body), gbnf_literal("}")));
}

Result<std::string> SchemaConverter::visit_array(const Json& s, const std::string& ptr,
                                                 const std::string& hint, int depth) {
  KILN_ASSIGN_OR_RETURN(const int64_t min_items, count_keyword(s, "minItems", ptr, 0));
  KILN_ASSIGN_OR_RETURN(int64_t max_items, count_keyword(s, "maxItems", ptr, -1));
  static const Json kAny = true;
  const Json* items = &kAny;
  if (s.contains("items")) {
    const Json& i = s["items"];
    if (i.is_array()) {
      return unimplemented("JSON schema: items as a list at {} is not supported (prefixItems is)",
                           pointer_append(ptr, "items"));
    }
    if (!i.is_boolean() && !i.is_object())
      return invalid_argument("JSON schema: items at {} is not a schema", ptr);
    items = (i.is_boolean() && !i.get<bool>()) ? nullptr : &i;
  }
  const Json empty_list = Json::array();
  const Json& prefix = s.contains("prefixItems") ? s["prefixItems"] : empty_list;
  if (!prefix.is_array()) return invalid_argument("JSON schema: prefixItems at {} is not a list", ptr);
  const auto k = static_cast<int64_t>(prefix.size());
  if (items == nullptr && (max_items < 0 || max_items > k)) max_items = k;
  if (max_items >= 0 && min_items > max_items) {
    return invalid_argument("JSON schema: the array at {} has minItems {} past its most items {}", ptr,
                            min_items, max_items);
  }

  const PendingRefsCleared consumed(pending_refs_);  // after the "[", $ref cycles consume characters

  std::vector<std::string> heads;
  for (int64_t i = 0; i < k && (max_items < 0 || i < max_items); ++i) {
    KILN_ASSIGN_OR_RETURN(std::string e,
                          visit(prefix[static_cast<size_t>(i)],
                                pointer_append(pointer_append(ptr, "prefixItems"), std::to_string(i)),
                                child_hint(hint, std::to_string(i)), depth + 1));
    heads.push_back(std::move(e));
  }
  std::string item;
  if (items != nullptr && (max_items < 0 || max_items > k)) {
    KILN_ASSIGN_OR_RETURN(item,
                          visit(*items, pointer_append(ptr, "items"), child_hint(hint, "item"), depth + 1));
  }
  // The items after the prefix: from a to b of them (b < 0: no bound), after `written` items.
  const int64_t a = std::max<int64_t>(0, min_items - k),
                b = max_items < 0 ? -1 : std::max<int64_t>(0, max_items - k);
  std::string tail;
  if (!item.empty() && b != 0) {
    if (heads.empty()) {
      tail = gbnf_seq(item, gbnf_repeat("(" + kComma + " " + item + ")", std::max<int64_t>(a, 1) - 1,
                                        b < 0 ? -1 : b - 1));
      if (a == 0) tail = "(" + tail + ")?";
    } else {
      tail = gbnf_repeat("(" + kComma + " " + item + ")", a, b);
    }
  }
  std::string body = tail;
  for (size_t i = heads.size(); i-- > 0;) {
    std::string part = gbnf_seq(i > 0 ? kComma + " " + heads[i] : heads[i], body);
    body = static_cast<int64_t>(i) >= min_items ? "(" + part + ")?" : part;
  }
  return rule(hint, gbnf_seq(gbnf_seq(gbnf_literal("["), body), gbnf_literal("]")));
}

Result<std::string> SchemaConverter::visit_string(const Json& s, const std::string& ptr,
                                                  const std::string& hint) {
  KILN_ASSIGN_OR_RETURN(const int64_t min_len, count_keyword(s, "minLength", ptr, 0));
  KILN_ASSIGN_OR_RETURN(const int64_t max_len, count_keyword(s, "maxLength", ptr, -1));
  if (max_len >= 0 && min_len > max_len) {
    return invalid_argument("JSON schema: minLength {} is past maxLength {} at {}", min_len, max_len, ptr);
  }
  if (s.contains("pattern") && s.contains("format")) {
    return unimplemented("JSON schema: pattern beside format at {} is not supported", ptr);
  }
  std::optional<std::string> pattern;
  std::string at;
  bool search = false;
  if (s.contains("pattern")) {
    at = pointer_append(ptr, "pattern");
    if (!s["pattern"].is_string()) return invalid_argument("JSON schema: pattern at {} is not a string", at);
    pattern = s["pattern"].get<std::string>();
    search = true;
  } else if (s.contains("format")) {
    at = pointer_append(ptr, "format");
    if (!s["format"].is_string()) return invalid_argument("JSON schema: format at {} is not a string", at);
    const std::string f = s["format"].get<std::string>();
    pattern = format_pattern(f);
    if (!pattern) {
      return unimplemented(
          "JSON schema: the format \"{}\" at {} is not supported (date, time, date-time, uuid, "
          "email are)",
          f, at);
    }
  }
  if (!pattern) {
    KILN_ASSIGN_OR_RETURN(const std::string c, primitive("char"));
    if (min_len == 0 && max_len < 0) return primitive("string");
    return rule(hint, fmt::format("{} {} {}", kQuote, gbnf_repeat(c, min_len, max_len), kQuote));
  }
  Result<Regex> re = parse_regex(*pattern);
  if (!re.ok()) return with_pointer(re.status(), at);
  if (search) regex_make_search(*re);
  if (min_len > 0 || max_len >= 0) {
    bool empty = false;
    const Status st =
        regex_restrict_length(re->root, min_len, max_len < 0 ? kRegexUnbounded : max_len, empty);
    if (!st.ok()) {
      return make_status(st.code(), "JSON schema: minLength/maxLength beside the pattern at {}: {}", at,
                         st.message());
    }
    if (empty) {
      return invalid_argument(
          "JSON schema: no string of the pattern at {} has a length within minLength and "
          "maxLength",
          at);
    }
  }
  return rule(hint, fmt::format("{} {} {}", kQuote, regex_gbnf_expr(re->root, true), kQuote));
}

Result<std::string> SchemaConverter::visit_number(const Json& s, const std::string& ptr,
                                                  const std::string& hint, bool integer) {
  NumberBound lo, hi;
  for (const bool lower : {true, false}) {
    const char* inclusive_key = lower ? "minimum" : "maximum";
    const char* exclusive_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    NumberBound inclusive, exclusive;
    if (s.contains(inclusive_key)) {
      KILN_ASSIGN_OR_RETURN(inclusive.value,
                            bound_value(s[inclusive_key], pointer_append(ptr, inclusive_key)));
      inclusive.set = true;
    }
    if (s.contains(exclusive_key)) {
      const Json& e = s[exclusive_key];
      if (e.is_boolean()) {  // draft 4: a flag on minimum / maximum
        inclusive.exclusive = inclusive.set && e.get<bool>();
      } else {
        KILN_ASSIGN_OR_RETURN(exclusive.value, bound_value(e, pointer_append(ptr, exclusive_key)));
        exclusive.set = exclusive.exclusive = true;
      }
    }
    (lower ? lo : hi) = tighter(inclusive, exclusive, lower);
  }
  if (!lo.set && !hi.set) return primitive(integer ? "integer" : "number");
  const std::string body = integer ? integer_range_gbnf(lo, hi) : number_range_gbnf(lo, hi);
  if (body.empty()) {
    return invalid_argument("JSON schema: no {} lies between the bounds at {}",
                            integer ? "integer" : "number", ptr);
  }
  return rule(hint, body);
}

}  // namespace kiln::grammar
