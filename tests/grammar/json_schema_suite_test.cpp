// The schema suite of tests/data/schemas (what the end-to-end tests constrain a model with): each converts,
// its grammar compiles, and its "examples" are accepted written compactly, not pretty-printed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "byte_matcher.h"
#include "grammar/json_schema.h"

namespace kiln::grammar {
namespace {

using test::ByteMatcher;
using Json = nlohmann::ordered_json;

TEST(JsonSchemaSuite, EverySchemaAcceptsItsExamples) {
  const std::filesystem::path dir = std::filesystem::path(KILN_TEST_DATA_DIR) / "schemas";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  ASSERT_GE(files.size(), 12u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    std::ifstream in(path);
    const Json schema = Json::parse(in);
    ASSERT_TRUE(schema.contains("examples"));
    auto gbnf = json_schema_to_gbnf(schema);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().to_string();
    ByteMatcher m(*gbnf);
    for (const auto& example : schema["examples"]) {
      EXPECT_TRUE(m.accepts(example.dump())) << example.dump() << "\n" << *gbnf;
      EXPECT_FALSE(m.accepts(example.dump(1))) << "pretty-printed";
    }
    EXPECT_FALSE(m.accepts("{}"));
  }
}

}  // namespace
}  // namespace kiln::grammar
