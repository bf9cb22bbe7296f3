// Constrained requests (Request::constraint) on the default model, on the CPU: a regular expression, a JSON
// schema and a GBNF grammar give text inside their language, greedy and sampled, ending with "stop"; a
// grammar that cannot complete within max_tokens ends with "length"; ignore_eos does not outlive the
// grammar's end; requests mixing constrained and unconstrained ones leave the unconstrained ones' tokens as
// they are alone (the CPU is batch-invariant); bad constraints are submit() errors that name them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace kiln {
namespace {

using test::collect;
using test::Collected;

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions o;
    o.n_ctx = 256;
    o.n_seq_max = 5;
    o.quantize_activations = true;  // kiln run's default, several times faster than exact f32 here
    return test::make_engine(o);
  }();
  return *e;
}

Request constrained(const char* prompt, OutputConstraint::Kind kind, std::string text, float temperature,
                    uint64_t seed = 1) {
  Request r;
  r.messages = {{"user", prompt}};
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.max_tokens = 128;  // kSchema's longest sentence without escapes is 70 bytes
  r.constraint = {kind, std::move(text)};
  return r;
}

Collected run(const Request& r, RequestStats* stats = nullptr) {
  Collected c;
  auto id = engine().submit(r, collect(c));
  EXPECT_TRUE(id.ok()) << id.status().message();
  if (!id.ok()) return c;
  auto st = engine().wait(*id);
  EXPECT_TRUE(st.ok());
  if (stats != nullptr && st.ok()) *stats = *st;
  EXPECT_EQ(c.finals, 1);
  return c;
}

constexpr const char* kRegex = "[0-9]{3}-[a-z]{2,5}";
constexpr const char* kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 16},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}},
  "required": ["name", "age"], "additionalProperties": false})";

void expect_person(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 16u) << text;  // bytes >= characters
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0);
  EXPECT_LE(j["age"].get<int64_t>(), 150);
  for (const auto& [k, v] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "tags") << text;
}

TEST(EngineGrammar, RegexAndJsonSchemaGreedyAndSampled) {
  const std::regex re(kRegex);
  for (const float t : {0.0f, 0.9f}) {
    for (uint64_t seed = 1; seed <= (t == 0.0f ? 1u : 3u); ++seed) {
      RequestStats st;
      const Collected a =
          run(constrained("Give me a product code.", OutputConstraint::Kind::regex, kRegex, t, seed), &st);
      EXPECT_EQ(a.finish, FinishReason::stop) << a.text << " " << a.error;
      EXPECT_TRUE(std::regex_match(a.text, re)) << "'" << a.text << "'";
      const Collected b = run(
          constrained("Describe a person as JSON.", OutputConstraint::Kind::json_schema, kSchema, t, seed));
      EXPECT_EQ(b.finish, FinishReason::stop) << b.text << " " << b.error;
      expect_person(b.text);
    }
  }
  const Collected c = run(constrained("Is the sky blue? Answer yes or no.", OutputConstraint::Kind::gbnf,
                                      R"(root ::= "yes" | "no")", 0.0f));
  EXPECT_EQ(c.finish, FinishReason::stop);
  EXPECT_TRUE(c.text == "yes" || c.text == "no") << c.text;
}

TEST(EngineGrammar, LengthIgnoreEosAndBadConstraints) {
  // Forty letters cannot fit in 5 tokens.
  Request r = constrained("Write letters.", OutputConstraint::Kind::regex, "[a-z]{40}", 0.0f);
  r.sampling.max_tokens = 5;
  RequestStats st;
  const Collected a = run(r, &st);
  EXPECT_EQ(a.finish, FinishReason::length);
  EXPECT_EQ(st.n_generated, 5);
  EXPECT_TRUE(std::regex_match(a.text, std::regex("[a-z]*"))) << a.text;
  // ignore_eos: the grammar's end still ends the request.
  Request e = constrained("Give me a product code.", OutputConstraint::Kind::regex, kRegex, 0.0f);
  e.sampling.ignore_eos = true;
  const Collected b = run(e);
  EXPECT_EQ(b.finish, FinishReason::stop);
  EXPECT_TRUE(std::regex_match(b.text, std::regex(kRegex))) << b.text;

  const auto expect_refused = [](OutputConstraint::Kind kind, const char* text, const char* needle) {
    Collected c;
    auto id = engine().submit(constrained("hi", kind, text, 0.0f), collect(c));
    ASSERT_FALSE(id.ok()) << text;
    EXPECT_NE(id.status().message().find(needle), std::string::npos) << id.status().message();
    EXPECT_EQ(c.finals, 0);
  };
  expect_refused(OutputConstraint::Kind::gbnf, "root ::= \"a\" undefined-rule", "gbnf");
  expect_refused(OutputConstraint::Kind::gbnf, "root ::= \"a\" undefined-rule", "undefined-rule");
  expect_refused(OutputConstraint::Kind::regex, "(ab", "regex");
  expect_refused(OutputConstraint::Kind::json_schema, "{\"type\": ", "json_schema");
  expect_refused(OutputConstraint::Kind::json_schema, R"({"type": "object", "not": {}})", "not");
}

TEST(EngineGrammar, UnconstrainedRequestsAreTheSameBesideConstrainedOnes) {
  const auto plain = [](const char* prompt, float t) {
    Request r;
    r.prompt = prompt;
    r.sampling.temperature = t;
    r.sampling.seed = 7;
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = true;
    return r;
  };
  const std::vector<Request> unconstrained = {plain("The capital of France is", 0.0f),
                                              plain("Once upon a time", 0.8f)};
  std::vector<Collected> alone;
  for (const Request& r : unconstrained) alone.push_back(run(r));
  // The same two among three constrained ones (two share one compiled grammar, their masks filled at once),
  // all submitted before any runs.
  std::vector<Request> mixed = {
      unconstrained[0],
      constrained("Describe a person as JSON.", OutputConstraint::Kind::json_schema, kSchema, 0.7f, 3),
      unconstrained[1], constrained("Give me a product code.", OutputConstraint::Kind::regex, kRegex, 0.0f),
      constrained("Describe a person as JSON.", OutputConstraint::Kind::json_schema, kSchema, 1.0f, 4)};
  std::vector<Collected> got(mixed.size());
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < mixed.size(); ++i) {
    auto id = engine().submit(mixed[i], collect(got[i]));
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
  }
  for (const uint64_t id : ids) ASSERT_TRUE(engine().wait(id).ok());
  EXPECT_EQ(got[0].tokens, alone[0].tokens);
  EXPECT_EQ(got[2].tokens, alone[1].tokens);
  expect_person(got[1].text);
  EXPECT_TRUE(std::regex_match(got[3].text, std::regex(kRegex))) << got[3].text;
  expect_person(got[4].text);
}

}  // namespace
}  // namespace kiln
