// JSON Schema to GBNF (json_schema.h): for each construct, instances accepted and rejected by a matcher over
// the generated grammar (byte tokens, compact JSON), and the errors of bad or unsupported schemas.
#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "byte_matcher.h"

namespace kiln::grammar {
namespace {

using test::ByteMatcher;
using Json = nlohmann::ordered_json;

std::string gbnf_of(const std::string& schema) {
  auto r = json_schema_to_gbnf(Json::parse(schema));
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : "";
}

void check(const std::string& schema, const std::vector<std::string>& accepted,
           const std::vector<std::string>& rejected) {
  SCOPED_TRACE(schema);
  const std::string gbnf = gbnf_of(schema);
  if (gbnf.empty()) return;
  ByteMatcher m(gbnf);
  for (const auto& s : accepted) EXPECT_TRUE(m.accepts(s)) << "should accept " << s << "\n" << gbnf;
  for (const auto& s : rejected) EXPECT_FALSE(m.accepts(s)) << "should reject " << s << "\n" << gbnf;
}

void check_error(const std::string& schema, StatusCode code, const std::vector<std::string>& needles) {
  SCOPED_TRACE(schema);
  auto r = json_schema_to_gbnf(Json::parse(schema));
  ASSERT_FALSE(r.ok()) << *r;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  for (const auto& n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "no '" << n << "' in " << r.status().message();
  }
}

TEST(JsonSchemaToGbnf, ObjectsRequiredAndOptionalInSchemaOrder) {
  const std::string person = R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}},
      "required": ["name"]})";
  check(person,
        {R"({"name":"Al"})", R"({"name":"Al","age":30})", R"({"name":"Al","email":"a@b"})",
         R"({"name":"Al","age":-3,"email":"a@b"})"},
        {R"({})", R"({"age":30})", R"({"age":30,"name":"Al"})", R"({"name":"Al","x":1})", R"({"name": "Al"})",
         R"( {"name":"Al"})", R"({"name":"Al",})", R"({"name":"Al","age":30,"age":30})"});
  // No required property: any subset, the empty object included.
  check(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}})",
        {"{}", R"({"a":1})", R"({"b":true})", R"({"a":1,"b":false})"}, {R"({"b":true,"a":1})", R"({"c":1})"});
  // A required property in the middle: the optional ones before it may be skipped, not those after it.
  check(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}}, "required": ["b"]})",
        {R"({"b":2})", R"({"a":1,"b":2})", R"({"b":2,"c":3})", R"({"a":1,"b":2,"c":3})"},
        {R"({"a":1})", R"({"a":1,"c":3})", "{}"});
  check(R"({"type": "object"})", {"{}", R"({"k":[1,{"x":null}]})"}, {"[]", R"({"k"})"});
  check(R"({"type": "object", "additionalProperties": false})", {"{}"}, {R"({"a":1})"});
}

TEST(JsonSchemaToGbnf, ManyOptionalPropertiesUseChainedRules) {
  Json schema = {{"type", "object"}, {"properties", Json::object()}, {"required", {"p30"}}};
  for (int i = 0; i < 40; ++i) schema["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
  auto gbnf = json_schema_to_gbnf(schema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
  ByteMatcher m(*gbnf);
  EXPECT_TRUE(m.accepts(R"({"p30":1})"));
  EXPECT_TRUE(m.accepts(R"({"p0":0,"p29":1,"p30":2,"p39":3})"));
  EXPECT_FALSE(m.accepts(R"({"p31":1})"));
  EXPECT_FALSE(m.accepts(R"({"p29":1,"p0":0,"p30":2})"));
}

TEST(JsonSchemaToGbnf, AdditionalProperties) {
  const std::string s =
      R"({"type": "object", "properties": {"id": {"type": "integer"}, "ab": {"type": "null"}},
      "required": ["id"], "additionalProperties": {"type": "string", "maxLength": 3}})";
  check(s,
        {R"({"id":1})", R"({"id":1,"ab":null})", R"({"id":1,"x":"abc"})",
         R"({"id":1,"ab":null,"a":"","abc":"q"})", R"({"id":1,"":"e"})",
         R"({"id":1,"i":"x","idx":"y","a\"b":"z"})"},
        {R"({"id":1,"x":"abcd"})", R"({"id":1,"x":1})", R"({"id":1,"id":"x"})", R"({"id":1,"ab":"x"})",
         R"({"x":"a","id":1})"});
  // Declared names with escapes and non-ASCII characters, and extra keys that only share a prefix with them.
  check(R"({"properties": {"a\"b": {"type": "integer"}, "\u540d\u524d": {"type": "string"}},
      "additionalProperties": {"type": "integer"}})",
        {R"({"a\"b":1,"名前":"x"})", R"({"名":1})", R"({"名前x":1})", R"({"a\\":3})"},
        {R"({"名前":1})", R"({"a\"b":1,"a\"b":2})"});
  check(R"({"type": "object", "additionalProperties": true})", {"{}", R"({"a":[true],"b":{}})"}, {"{,}"});
  // A required name outside properties takes the additionalProperties schema.
  check(
      R"({"properties": {"a": {"type": "integer"}}, "required": ["z"],
          "additionalProperties": {"type": "boolean"}})",
      {R"({"z":true})", R"({"a":1,"z":false})", R"({"a":1,"z":true,"q":false})"},
      {R"({"a":1})", R"({"z":1})"});
}

TEST(JsonSchemaToGbnf, Arrays) {
  const std::string items = R"({"type": "array", "items": {"type": "object",
      "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
      "required": ["sku", "qty"]},
      "minItems": 1, "maxItems": 3})";
  check(items,
        {R"([{"sku":"a","qty":1}])", R"([{"sku":"a","qty":1},{"sku":"b","qty":2},{"sku":"c","qty":9}])"},
        {"[]", R"([{"sku":"a","qty":0}])",
         R"([{"sku":"a","qty":1},{"sku":"b","qty":2},{"sku":"c","qty":9},)"
         R"({"sku":"d","qty":1}])",
         R"([{"sku":"a","qty":1},])", R"([{"sku":"a","qty":1} ])"});
  check(R"({"type": "array"})", {"[]", R"([1,"a",null,[{}]])"}, {"[,]", "[1,]"});
  check(R"({"type": "array", "items": {"type": "integer"}, "maxItems": 0})", {"[]"}, {"[1]"});
  check(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2})", {"[1,2]", "[1,2,3,4,5]"},
        {"[]", "[1]"});
  check(R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2})", {"[true,false]"},
        {"[true]", "[true,true,true]"});
  // prefixItems: a tuple, then `items` for the rest (false: nothing more).
  check(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
        {"[]", R"(["a"])", R"(["a",1])"}, {R"([1])", R"(["a",1,2])"});
  check(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2,
      "items": {"type": "null"}})",
        {R"(["a",1])", R"(["a",1,null,null])"}, {R"(["a"])", R"(["a",1,2])"});
}

TEST(JsonSchemaToGbnf, EnumAndConst) {
  check(R"({"enum": ["red", "green", 3, null, {"a": [1, "x"]}, "say \"hi\""]})",
        {R"("red")", R"("green")", "3", "null", R"({"a":[1,"x"]})", R"("say \"hi\"")"},
        {R"("blue")", "4", R"({"a": [1, "x"]})", "\"red"});
  check(R"({"const": "fixed"})", {R"("fixed")"}, {R"("other")"});
  check(R"({"type": "string", "enum": ["a", 1, "b"]})", {R"("a")", R"("b")"}, {"1"});
  check(R"({"type": "integer", "enum": [1.0, 2.5, "x"]})", {"1.0"}, {"2.5", R"("x")"});
  check(R"({"const": "\u00e9\n"})", {"\"\xC3\xA9\\n\""}, {"\"\\u00e9\\n\""});
}

TEST(JsonSchemaToGbnf, AnyOfOneOfAllOf) {
  const std::string shapes = R"({"anyOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
       "required": ["kind", "r"]},
      {"type": "object",
       "properties": {"kind": {"const": "rect"}, "w": {"type": "number"}, "h": {"type": "number"}},
       "required": ["kind", "w", "h"]}]})";
  check(shapes, {R"({"kind":"circle","r":1.5})", R"({"kind":"rect","w":2,"h":3e2})"},
        {R"({"kind":"circle","w":2,"h":3})", R"({"kind":"rect","r":1})", "{}"});
  check(R"({"oneOf": [{"type": "integer"}, {"type": "boolean"}]})", {"7", "true"}, {R"("7")"});
  check(R"({"type": ["string", "null"], "maxLength": 2})", {R"("ab")", "null"}, {R"("abc")", "0"});
  // Keywords beside anyOf apply to every branch.
  check(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})",
        {R"({"a":1})", R"({"b":1})", R"({"a":1,"b":2})"}, {"{}"});
  check(R"({"type": "string", "anyOf": [{"maxLength": 1}, {"type": "integer"}]})", {R"("a")"},
        {R"("ab")", "1"});
  check(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})",
        {R"({"a":1,"b":"x"})"}, {R"({"a":1})", R"({"b":"x"})"});
  check(R"({"allOf": [{"type": ["integer", "string"]}, {"type": "number", "minimum": 0, "maximum": 9}]})",
        {"5"}, {"-1", "5.5", R"("5")"});
}

TEST(JsonSchemaToGbnf, Strings) {
  check(R"({"type": "string"})",
        {R"("")", R"("plain")", R"("a\"b\\c\/\b\f\n\r\t\u00e9")", "\"h\xC3\xA9llo \xF0\x9F\x98\x80\""},
        {"\"a\tb\"", "\"a\nb\"", std::string("\"a\x01\""), "\"a\x7F\"", R"("\x")", R"("\u12")", R"("a)",
         "abc"});
  // Lengths count characters: an escape or a multi-byte character is one.
  check(R"({"type": "string", "minLength": 2, "maxLength": 3})",
        {R"("ab")", R"("abc")", "\"\xC3\xA9\xC3\xA9\"", R"("\n\u0041")"},
        {R"("a")", R"("abcd")", "\"\xC3\xA9\""});
  check(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})", {R"("AB-123")"},
        {R"("AB-12")", R"("ab-123")"});
  // Unanchored patterns search: anything may come before and after.
  check(R"({"type": "string", "pattern": "ab+c"})", {R"("abc")", R"("xxabbbcyy")"}, {R"("ac")", R"("abx")"});
  check(R"({"type": "string", "pattern": "^x"})", {R"("x")", R"("xyz")"}, {R"("ax")"});
  check(R"({"type": "string", "pattern": "^a|b$|c"})", {R"("axx")", R"("xxb")", R"("xcx")"},
        {R"("xa")", R"("bx")"});
  check(R"({"type": "string", "pattern": "a|"})", {R"("")", R"("zzz")"}, {});
  // The pattern holds on the decoded string: its quotes, backslashes and controls are written escaped.
  check(R"({"type": "string", "pattern": "^a\"b\\\\c\\n[^a]$"})",
        {R"("a\"b\\c\n\"")", R"("a\"b\\c\n\u0001")"}, {"\"a\"b\\c\n\"\"", R"("a\"b\\c\na")"});
  check(R"({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4})", {R"("abcd")"},
        {R"("abcde")", R"("")"});
  check(R"({"type": "string", "pattern": "^id-[0-9]*$", "minLength": 5, "maxLength": 6})", {R"("id-12")"},
        {R"("id-1")", R"("id-1234")"});
}

TEST(JsonSchemaToGbnf, Formats) {
  check(R"({"type": "string", "format": "date"})",
        {R"("2024-02-29")", R"("2000-02-29")", R"("2023-02-28")", R"("1999-12-31")", R"("2023-04-30")"},
        {R"("2023-02-29")", R"("1900-02-29")", R"("2024-02-30")", R"("2024-04-31")", R"("2024-13-01")",
         R"("2024-1-01")", R"("24-01-01")"});
  check(R"({"type": "string", "format": "time"})", {R"("23:59:59Z")", R"("08:00:00.123+02:00")"},
        {R"("24:00:00Z")", R"("12:00:00")", R"("12:60:00Z")"});
  check(R"({"type": "string", "format": "date-time"})", {R"("2024-05-06T07:08:09Z")"},
        {R"("2024-05-06 07:08:09Z")", R"("2024-05-06")"});
  check(R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
        {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  check(R"({"type": "string", "format": "email"})", {R"("ann.lee+x@mail.example.org")"},
        {R"("ann@")", R"("@example.org")", R"("ann@localhost")", R"("a b@c.org")"});
  check(R"({"type": "string", "format": "date", "maxLength": 10})", {R"("2024-01-01")"}, {});
}

TEST(JsonSchemaToGbnf, RefsAndRecursion) {
  const std::string tree = R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"value": {"type": "integer"},
                     "children": {"type": "array", "items": {"$ref": "#/$defs/node"},
      "maxItems": 3}}, "required": ["value"]}}})";
  check(tree,
        {R"({"value":1})", R"({"value":1,"children":[{"value":2},{"value":3,"children":[{"value":4}]}]})"},
        {R"({"value":1,"children":[{}]})", R"({"children":[]})"});
  check(
      R"({"definitions": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/definitions/n"}})",
      {"[1,2]"}, {R"(["1"])"});
  // "#" is the root: a linked list.
  check(
      R"({"type": "object", "properties": {"v": {"type": "boolean"}, "next": {"$ref": "#"}},
          "required": ["v"]})",
      {R"({"v":true})", R"({"v":true,"next":{"v":false,"next":{"v":true}}})"}, {R"({"v":true,"next":{}})"});
  check(R"({"$defs": {"a~b/c": {"const": 1}}, "$ref": "#/$defs/a~0b~1c"})", {"1"}, {"2"});
}

TEST(JsonSchemaToGbnf, AnyJsonValue) {
  check("{}", {"1", R"("a")", "null", R"({"a":[1,2,{"b":false}]})", "-1.5e3"},
        {"", "nul", "[1,]", "{\"a\" :1}"});
  check("true", {"[]", "true"}, {"tru"});
  SchemaGrammar g;
  const std::string obj = g.add_any_json("obj", true);
  const std::string val = g.add_any_json("val", false);
  EXPECT_NE(obj, val);
  ByteMatcher objects("root ::= " + obj + "\n" + g.rules());
  EXPECT_TRUE(objects.accepts(R"({"a":[1,"x"]})"));
  EXPECT_FALSE(objects.accepts("[1]"));
  ByteMatcher values("root ::= " + val + "\n" + g.rules());
  EXPECT_TRUE(values.accepts("[1]"));
}

TEST(JsonSchemaToGbnf, SchemasShareOneGrammar) {
  SchemaGrammar g;
  auto a =
      g.add(Json::parse(R"({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})"),
            "tool");
  auto b =
      g.add(Json::parse(R"({"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"]})"),
            "tool");
  auto c = g.add(Json::parse(R"({"const": 5})"), "five");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(g.add(Json::parse("{}"), "Bad_Name").status().code(), StatusCode::invalid_argument);
  ByteMatcher m("root ::= " + *a + " | " + *b + " | " + *c + "\n" + g.rules());
  EXPECT_TRUE(m.accepts(R"({"x":1})"));
  EXPECT_TRUE(m.accepts(R"({"y":"s"})"));
  EXPECT_TRUE(m.accepts("5"));
  EXPECT_FALSE(m.accepts(R"({"x":"s"})"));
}

TEST(JsonSchemaToGbnf, UnsupportedKeywordsAreNamedWithTheirPointer) {
  check_error(R"({"properties": {"a": {"type": "integer", "multipleOf": 2}}})", StatusCode::unimplemented,
              {"\"multipleOf\"", "#/properties/a/multipleOf"});
  check_error(R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})",
              StatusCode::unimplemented, {"uniqueItems", "#/uniqueItems"});
  check_error(R"({"type": "object", "patternProperties": {"^x": {}}})", StatusCode::unimplemented,
              {"patternProperties"});
  check_error(R"({"type": "string", "format": "uri"})", StatusCode::unimplemented, {"\"uri\"", "#/format"});
  check_error(R"({"$ref": "https://example.com/s.json"})", StatusCode::unimplemented,
              {"not supported", "#/$ref"});
  check_error(R"({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": {}}})", StatusCode::unimplemented,
              {"beside $ref", "#/type"});
  check_error(R"js({"properties": {"p": {"type": "string", "pattern": "(?=x)"}}})js",
              StatusCode::unimplemented, {"#/properties/p/pattern", "lookaround"});
  check_error(R"({"type": "string", "pattern": "^[a-z]+[0-9]+$", "maxLength": 5})", StatusCode::unimplemented,
              {"length"});
  check_error(R"({"enum": ["a", "bb"], "minLength": 2})", StatusCode::unimplemented,
              {"minLength", "#/minLength"});
  check_error(R"({"type": "array", "items": [{"type": "integer"}]})", StatusCode::unimplemented,
              {"prefixItems"});
}

TEST(JsonSchemaToGbnf, InvalidSchemas) {
  check_error(R"({"type": "strin"})", StatusCode::invalid_argument, {"\"strin\"", "#/type"});
  check_error(R"({"type": "string", "minLength": -1})", StatusCode::invalid_argument,
              {"minLength", "#/minLength"});
  check_error(R"({"type": "string", "minLength": 3, "maxLength": 2})", StatusCode::invalid_argument,
              {"minLength"});
  check_error(R"({"type": "array", "minItems": 3, "maxItems": 2})", StatusCode::invalid_argument,
              {"minItems"});
  check_error(R"({"type": "integer", "minimum": 5, "maximum": 4})", StatusCode::invalid_argument,
              {"no integer"});
  check_error(R"({"type": "integer", "minimum": 4.2, "maximum": 4.8})", StatusCode::invalid_argument,
              {"no integer"});
  check_error(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", StatusCode::invalid_argument,
              {"no number"});
  check_error(R"({"$ref": "#/$defs/missing"})", StatusCode::invalid_argument, {"points to nothing"});
  check_error(
      R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
          "$ref": "#/$defs/a"})",
      StatusCode::invalid_argument, {"comes back to itself"});
  check_error("false", StatusCode::invalid_argument, {"false"});
  check_error("[1]", StatusCode::invalid_argument, {"not an object"});
  check_error(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})",
              StatusCode::invalid_argument, {"#/properties/a"});
  check_error(R"({"type": "object", "properties": {}, "required": ["z"], "additionalProperties": false})",
              StatusCode::invalid_argument, {"\"z\""});
  check_error(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", StatusCode::invalid_argument,
              {"allOf"});
  check_error(R"({"type": "string", "pattern": "^[a-z]{3}$", "maxLength": 2})", StatusCode::invalid_argument,
              {"#/pattern"});
  check_error(R"({"type": "string", "pattern": "(a"})", StatusCode::invalid_argument,
              {"#/pattern", "offset 0"});
}

TEST(JsonSchemaToGbnf, SizeBoundsNameTheBound) {
  check_error(R"({"type": "string", "maxLength": 1000000000})", StatusCode::resource_exhausted,
              {"maxLength", "#/maxLength", "10000"});
  check_error(R"({"type": "array", "maxItems": 20000})", StatusCode::resource_exhausted,
              {"maxItems", "10000"});
  Json big_enum = {{"enum", Json::array()}};
  for (int i = 0; i < 40'000; ++i) big_enum["enum"].push_back("value number " + std::to_string(i));
  auto r = json_schema_to_gbnf(big_enum);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(r.status().message().find("1048576 bytes"), std::string::npos) << r.status().message();
  Json deep = {{"type", "integer"}};
  for (int i = 0; i < 200; ++i) deep = {{"type", "array"}, {"items", deep}};
  r = json_schema_to_gbnf(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(r.status().message().find("deeper than"), std::string::npos) << r.status().message();
  // anyOf beside other keywords copies them into each branch: nested, that multiplies.
  Json wide = {{"type", "integer"}};
  for (int i = 0; i < 30; ++i) {
    wide = {{"type", "object"},
            {"properties", {{"p", wide}}},
            {"anyOf", {{{"required", {"p"}}}, {{"title", "x"}}}}};
  }
  r = json_schema_to_gbnf(wide);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::resource_exhausted) << r.status().to_string();
}

}  // namespace
}  // namespace kiln::grammar
