// oneOf's exclusivity (json_schema.h: SchemaOptions::strict): branches shown to exclude each other give the
// same exact grammar with strict as without; branches that may overlap are refused under strict, naming the
// oneOf's JSON pointer, and enforced as anyOf without it. Each "may overlap" case is a value that two
// branches accept under JSON Schema's rules, so that the analysis is never more confident than the schema.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "byte_matcher.h"
#include "grammar/json_schema.h"

namespace kiln::grammar {
namespace {

using test::ByteMatcher;
using Json = nlohmann::ordered_json;

// Passes strict with the grammar it has without strict.
void expect_exclusive(const std::string& schema) {
  SCOPED_TRACE(schema);
  auto loose = json_schema_to_gbnf(Json::parse(schema));
  auto strict = json_schema_to_gbnf(Json::parse(schema), {.strict = true});
  ASSERT_TRUE(loose.ok()) << loose.status().to_string();
  ASSERT_TRUE(strict.ok()) << strict.status().to_string();
  EXPECT_EQ(*strict, *loose);
}

// Refused under strict, naming `pointer` (the oneOf) and the two branches; converted without strict.
void expect_overlap(const std::string& schema, const std::string& pointer, const std::string& branches) {
  SCOPED_TRACE(schema);
  auto strict = json_schema_to_gbnf(Json::parse(schema), {.strict = true});
  ASSERT_FALSE(strict.ok()) << *strict;
  EXPECT_EQ(strict.status().code(), StatusCode::unimplemented);
  const std::string& m = strict.status().message();
  EXPECT_NE(m.find("oneOf at " + pointer + " "), std::string::npos) << m;
  EXPECT_NE(m.find("branches " + branches + " "), std::string::npos) << m;
  EXPECT_TRUE(json_schema_to_gbnf(Json::parse(schema)).ok());
}

// A pydantic discriminated union: $defs, $ref branches, a required "pet_type" with a different const.
const char* kPets = R"({
  "$defs": {
    "Cat": {"type": "object", "properties": {
             "pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
             "meows": {"type": "integer"}},
            "required": ["pet_type", "meows"], "title": "Cat"},
    "Dog": {"type": "object", "properties": {
             "pet_type": {"const": "dog", "title": "Pet Type", "type": "string"},
             "barks": {"type": "number"}},
            "required": ["pet_type", "barks"], "title": "Dog"},
    "Lizard": {"type": "object", "properties": {"pet_type": {"enum": ["reptile", "lizard"], "type": "string"},
                "scales": {"type": "boolean"}}, "required": ["pet_type", "scales"], "title": "Lizard"}
  },
  "type": "object",
  "properties": {"pet": {
      "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Lizard"}],
      "discriminator": {"propertyName": "pet_type"}}},
  "required": ["pet"]
})";

TEST(JsonSchemaOneOf, ExclusiveBranchesPassStrict) {
  // Different JSON types.
  expect_exclusive(R"({"oneOf": [{"type": "integer"}, {"type": "boolean"}, {"type": "null"}]})");
  expect_exclusive(R"({"oneOf": [{"type": ["string", "null"]}, {"type": "array"}, {"type": "object"}]})");
  // Disjoint const / enum values at the top, and a value of a type the other branch does not take.
  expect_exclusive(R"({"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}, {"enum": [1, 2]}]})");
  expect_exclusive(R"({"oneOf": [{"const": 3}, {"type": "string"}]})");
  // However many: a oneOf of 3,000 consts (a documented enum).
  Json consts = {{"oneOf", Json::array()}};
  for (int i = 0; i < 3000; ++i)
    consts["oneOf"].push_back({{"const", i}, {"title", "v" + std::to_string(i)}});
  expect_exclusive(consts.dump());
  // Objects told apart by a required property's const, enum or type.
  expect_exclusive(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
       "required": ["kind", "r"]},
      {"type": "object", "properties": {"kind": {"enum": ["rect", "square"]}, "w": {"type": "number"}},
       "required": ["kind"]}]})");
  expect_exclusive(R"({"oneOf": [
      {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
      {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}]})");
  // A key one branch requires and the other does not allow (OpenAI strict schemas' additionalProperties).
  expect_exclusive(R"({"oneOf": [
      {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"],
       "additionalProperties": false},
      {"type": "object", "properties": {"phone": {"type": "string"}}, "required": ["phone"],
       "additionalProperties": false}]})");
  // A discriminator one level down, and the keywords beside oneOf applying to every branch.
  expect_exclusive(R"({"type": "object", "required": ["meta"], "oneOf": [
      {"properties": {"meta": {"type": "object", "properties": {"v": {"const": 1}}, "required": ["v"]}}},
      {"properties": {"meta": {"type": "object", "properties": {"v": {"const": 2}}, "required": ["v"]}}}]})");
  expect_exclusive(kPets);
  // A nullable branch (anyOf with null) and a recursive schema.
  std::string pets = kPets;
  const std::string cat = R"({"$ref": "#/$defs/Cat"})";
  pets.replace(pets.find(cat), cat.size(), R"({"anyOf": [{"type": "null"}, )" + cat + "]}");
  expect_exclusive(pets);
  expect_exclusive(R"({"type": "object", "properties": {"next": {"oneOf": [{"type": "null"}, {"$ref": "#"}]}},
      "required": ["next"]})");
  // A false branch matches nothing, nor does one whose type the keywords beside oneOf rule out.
  expect_exclusive(R"({"oneOf": [{"type": "string"}, false, {"type": "integer"}]})");
  expect_exclusive(
      R"({"type": "string", "oneOf": [{"type": ["string", "integer"]}, {"type": ["integer", "null"]}]})");
}

TEST(JsonSchemaOneOf, BranchesThatMayOverlapAreRefusedUnderStrict) {
  // "ab" matches both.
  expect_overlap(R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]})", "#/oneOf",
                 "0 and 1");
  // 1 is an integer and a number.
  expect_overlap(R"({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 5}]})", "#/oneOf",
                 "0 and 1");
  // Without "type" a schema accepts every type: "x" matches both.
  expect_overlap(R"({"oneOf": [{"type": "string"}, {"properties": {"a": {"type": "integer"}}}]})", "#/oneOf",
                 "0 and 1");
  // 1 == 1.0, and object keys in any order are one value.
  expect_overlap(R"({"oneOf": [{"enum": [1, "a"]}, {"const": 1.0}]})", "#/oneOf", "0 and 1");
  expect_overlap(R"({"oneOf": [{"const": [2, {"x": 1e19}]}, {"const": [2.0, {"x": 10000000000000000000}]}]})",
                 "#/oneOf", "0 and 1");
  expect_overlap(R"({"oneOf": [{"const": 0}, {"const": "a"}, {"enum": [null, -0.0]}]})", "#/oneOf",
                 "0 and 2");
  expect_overlap(R"({"oneOf": [{"const": {"a": 1, "b": [2]}}, {"enum": [{"b": [2], "a": 1}]}]})", "#/oneOf",
                 "0 and 1");
  // A discriminator that neither branch requires: {} matches both.
  expect_overlap(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}}},
      {"type": "object", "properties": {"kind": {"const": "b"}}}]})",
                 "#/oneOf", "0 and 1");
  // Different required keys that either branch allows: {"a": 1, "b": 2} matches both.
  expect_overlap(R"({"properties": {"x": {"oneOf": [
      {"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]}}})",
                 "#/properties/x/oneOf", "0 and 1");
  // The overlapping pair is named, past the exclusive ones; a pointer inside $defs.
  expect_overlap(R"({"oneOf": [{"type": "null"}, {"const": "a"}, {"type": "string"}]})", "#/oneOf",
                 "1 and 2");
  expect_overlap(R"({"$defs": {"u": {"oneOf": [{"type": "array"}, {"type": "array", "maxItems": 1}]}},
      "$ref": "#/$defs/u"})",
                 "#/$defs/u/oneOf", "0 and 1");
  // Branches without a type, both strings through the keywords beside oneOf: "ab" matches both.
  expect_overlap(R"({"type": "string", "oneOf": [{"maxLength": 3}, {"minLength": 1}]})", "#/oneOf",
                 "0 and 1");
}

TEST(JsonSchemaOneOf, WithoutStrictOverlappingBranchesAreAnyOf) {
  // As llama.cpp, vLLM and xgrammar enforce oneOf: a value of both branches is allowed.
  const std::string schema =
      R"({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]})";
  auto g = json_schema_to_gbnf(Json::parse(schema));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ByteMatcher m(*g);
  EXPECT_TRUE(m.accepts(R"("a")"));
  EXPECT_TRUE(m.accepts(R"("abcdef")"));
  EXPECT_TRUE(m.accepts(R"("ab")"));  // both branches: invalid under oneOf
  EXPECT_EQ(*g, *json_schema_to_gbnf(Json::parse(R"({"anyOf": [{"type": "string", "maxLength": 3},
      {"type": "string", "minLength": 2}]})")));
}

TEST(JsonSchemaOneOf, ExclusiveUnionIsExact) {
  auto g = json_schema_to_gbnf(Json::parse(kPets), {.strict = true});
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ByteMatcher m(*g);
  EXPECT_TRUE(m.accepts(R"({"pet":{"pet_type":"cat","meows":3}})"));
  EXPECT_TRUE(m.accepts(R"({"pet":{"pet_type":"lizard","scales":true}})"));
  EXPECT_FALSE(m.accepts(R"({"pet":{"pet_type":"dog","meows":3}})"));
  EXPECT_FALSE(m.accepts(R"({"pet":{"pet_type":"cat"}})"));
}

TEST(JsonSchemaOneOf, StrictReachesToolSchemas) {
  SchemaGrammar g;
  const Json overlapping =
      Json::parse(R"({"type": "object", "properties": {"v": {"oneOf": [{"type": "number"},
      {"type": "integer"}]}}})");
  EXPECT_TRUE(g.add(overlapping, "a").ok());
  auto r = g.add(overlapping, "b", {.strict = true});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("#/properties/v/oneOf"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kiln::grammar
