// safetensors reader: a valid file read back exactly, every class of malformed file refused with a
// message naming the field, and the sharded-folder checks. Bad files are built in memory.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace kiln::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A file: u64 LE header length, the header text, then `data_bytes` bytes of the pattern i*7+1.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char c : header) out.push_back(static_cast<uint8_t>(c));
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 7 + 1));
  return out;
}

// Two tensors, "a" F32 [2,3] at [0,24) and "b" BF16 [4] at [24,32), plus metadata.
json valid_header() {
  return json{{"a", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
              {"b", {{"dtype", "BF16"}, {"shape", {4}}, {"data_offsets", {24, 32}}}},
              {"__metadata__", {{"format", "pt"}}}};
}

// Parses `header` + `data_bytes` and expects an error whose message contains every one of `needles`.
void expect_error(const std::string& header, size_t data_bytes, std::vector<std::string> needles,
                  StatusCode code = StatusCode::invalid_argument) {
  const std::vector<uint8_t> bytes = make_file(header, data_bytes);
  auto r = File::parse(bytes, "bad.safetensors");
  ASSERT_FALSE(r.ok()) << header;
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  for (const std::string& n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message lacks \"" << n << "\": " << r.status().message();
  }
  EXPECT_NE(r.status().message().find("bad.safetensors"), std::string::npos) << r.status().message();
}

// The valid header with tensor "a"'s field `key` replaced by `value`.
std::string with_a_field(const char* key, const json& value) {
  json h = valid_header();
  h["a"][key] = value;
  return h.dump();
}
std::string without_a_field(const char* key) {
  json h = valid_header();
  h["a"].erase(key);
  return h.dump();
}

TEST(Safetensors, ValidFileReadsBack) {
  const std::vector<uint8_t> bytes = make_file(valid_header().dump() + "    ", 32);  // padded header
  auto r = File::parse(bytes, "ok.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const File& f = *r;
  ASSERT_EQ(f.tensors().size(), 2u);
  const Tensor* a = f.find("a");
  const Tensor* b = f.find("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(f.find("c"), nullptr);
  EXPECT_EQ(a->dtype, Dtype::dtype_f32);
  EXPECT_EQ(a->kiln_dtype(), DType::f32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->n_elements, 6);
  EXPECT_EQ(a->data.size(), 24u);
  EXPECT_EQ(a->data.data(), bytes.data() + f.data_offset());
  EXPECT_EQ(b->kiln_dtype(), DType::bf16);
  EXPECT_EQ(b->offset, 24u);
  EXPECT_EQ(b->data.data(), bytes.data() + f.data_offset() + 24);
  EXPECT_EQ(b->data[0], static_cast<uint8_t>(24 * 7 + 1));
  EXPECT_EQ(&f.tensors()[0], a);  // data order
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST(Safetensors, ScalarsEmptyTensorsAndAllDtypes) {
  json h = json::object();
  uint64_t off = 0;
  const char* names[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16",
                         "BF16", "I32", "U32", "F32",     "C64",     "F64",     "I64", "U64"};
  for (const char* n : names) {
    auto d = dtype_from_name(n);
    ASSERT_TRUE(d.ok()) << n;
    EXPECT_STREQ(dtype_name(*d), n);
    const uint64_t size = static_cast<uint64_t>(dtype_size(*d)) * 3;
    h[std::string("t_") + n] = {{"dtype", n}, {"shape", {3}}, {"data_offsets", {off, off + size}}};
    off += size;
  }
  h["scalar"] = {{"dtype", "F64"}, {"shape", json::array()}, {"data_offsets", {off, off + 8}}};
  h["empty"] = {{"dtype", "F32"}, {"shape", {0, 5}}, {"data_offsets", {off + 8, off + 8}}};
  const std::vector<uint8_t> bytes = make_file(h.dump(), off + 8);
  auto r = File::parse(bytes, "all.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find("scalar")->n_elements, 1);
  EXPECT_EQ(r->find("empty")->n_elements, 0);
  EXPECT_EQ(r->find("t_F8_E4M3")->kiln_dtype(), std::nullopt);
  EXPECT_EQ(r->find("t_I64")->kiln_dtype(), DType::i64);
}

// ---- One test per class of malformed file.

TEST(SafetensorsBad, FileShorterThanLengthField) {
  const std::vector<uint8_t> bytes = {1, 2, 3};
  auto r = File::parse(bytes, "short.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too short"), std::string::npos) << r.status().message();
}

TEST(SafetensorsBad, HeaderLengthOverCap) {
  std::vector<uint8_t> bytes = make_file("{}", 0);
  const uint64_t huge = (uint64_t{1} << 40);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(huge >> (8 * i));
  auto r = File::parse(bytes, "bad.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header length 1099511627776"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("limit"), std::string::npos) << r.status().message();
}

TEST(SafetensorsBad, HeaderLengthPastEndOfFile) {
  std::vector<uint8_t> bytes = make_file("{}", 0);
  bytes[0] = 200;
  auto r = File::parse(bytes, "bad.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("header length 200"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("past the end"), std::string::npos) << r.status().message();
}

TEST(SafetensorsBad, HeaderNotJson) {
  // The syntax error is on line 2, column 8 of the header.
  expect_error("{\"a\": {\n \"dtype\" \"F32\"}}", 0, {"header", ":2:", "invalid JSON"});
  expect_error("{\"a\": \"\xff\xfe\"}", 0, {"invalid JSON"});  // not UTF-8
}

TEST(SafetensorsBad, HeaderNotObject) {
  expect_error("[1, 2]", 0, {"header must be a JSON object", "array"});
}

TEST(SafetensorsBad, HeaderNestedTooDeep) {
  expect_error(std::string(1000, '[') + std::string(1000, ']'), 0, {"nesting"});
}

TEST(SafetensorsBad, EntryNotObject) {
  json h = valid_header();
  h["a"] = 5;
  expect_error(h.dump(), 32, {"tensor \"a\"", "must be an object", "5"});
}

TEST(SafetensorsBad, MissingDtype) {
  expect_error(without_a_field("dtype"), 32, {"tensor \"a\"", "\"dtype\""});
}
TEST(SafetensorsBad, DtypeNotString) {
  expect_error(with_a_field("dtype", 3), 32, {"tensor \"a\"", "\"dtype\" must be a string", "3"});
}
TEST(SafetensorsBad, UnknownDtype) {
  expect_error(with_a_field("dtype", "F33"), 32, {"tensor \"a\"", "dtype \"F33\""});
}
TEST(SafetensorsBad, SubByteDtypeUnimplemented) {
  expect_error(with_a_field("dtype", "F4"), 32, {"tensor \"a\"", "\"F4\"", "sub-byte"},
               StatusCode::unimplemented);
}
TEST(SafetensorsBad, MissingShape) {
  expect_error(without_a_field("shape"), 32, {"tensor \"a\"", "\"shape\""});
}
TEST(SafetensorsBad, ShapeNotArray) {
  expect_error(with_a_field("shape", "2x3"), 32, {"tensor \"a\"", "\"shape\" must be an array", "2x3"});
}
TEST(SafetensorsBad, NegativeDimension) {
  expect_error(with_a_field("shape", json{2, -3}), 32, {"tensor \"a\"", "shape[1]", "-3"});
}
TEST(SafetensorsBad, NonIntegerDimension) {
  expect_error(with_a_field("shape", json{2, 3.5}), 32, {"tensor \"a\"", "shape[1]", "3.5"});
}
TEST(SafetensorsBad, TooManyDimensions) {
  expect_error(with_a_field("shape", json{1, 1, 1, 1, 1, 1, 1, 1, 1, 6}), 32,
               {"tensor \"a\"", "10 dimensions"});
}
TEST(SafetensorsBad, ShapeProductOverflow) {
  expect_error(with_a_field("shape", json{uint64_t{1} << 40, uint64_t{1} << 40}), 32,
               {"tensor \"a\"", "int64"});
  expect_error(with_a_field("shape", json{uint64_t{1} << 63}), 32, {"tensor \"a\"", "shape[0]", "int64"});
  // Elements fit in int64 but bytes do not.
  expect_error(with_a_field("shape", json{uint64_t{1} << 62}), 32, {"tensor \"a\"", "bytes"});
}
TEST(SafetensorsBad, MissingDataOffsets) {
  expect_error(without_a_field("data_offsets"), 32, {"tensor \"a\"", "\"data_offsets\""});
}
TEST(SafetensorsBad, DataOffsetsNotAPair) {
  expect_error(with_a_field("data_offsets", json{0, 24, 32}), 32,
               {"tensor \"a\"", "data_offsets", "[begin, end]"});
  expect_error(with_a_field("data_offsets", json{0, "24"}), 32,
               {"tensor \"a\"", "data_offsets[1]", "\"24\""});
  expect_error(with_a_field("data_offsets", json{-8, 24}), 32, {"tensor \"a\"", "data_offsets[0]", "-8"});
}
TEST(SafetensorsBad, DataOffsetsEndBeforeBegin) {
  expect_error(with_a_field("data_offsets", json{24, 0}), 32,
               {"tensor \"a\"", "[24, 0]", "end before begin"});
}
TEST(SafetensorsBad, DataOffsetsDoNotMatchShape) {
  expect_error(with_a_field("data_offsets", json{0, 20}), 32, {"tensor \"a\"", "[0, 20]", "needs 24 bytes"});
}
TEST(SafetensorsBad, DataOffsetsPastDataSection) {
  json h = valid_header();
  h["b"]["data_offsets"] = {24, 32};
  expect_error(h.dump(), 30, {"tensor \"b\"", "[24, 32]", "data section (30 bytes)"});
}
TEST(SafetensorsBad, OverlappingTensors) {
  json h = valid_header();
  h["b"]["data_offsets"] = {16, 24};
  expect_error(h.dump(), 32, {"overlaps", "\"a\"", "\"b\""});
}
TEST(SafetensorsBad, HoleBetweenTensors) {
  json h = valid_header();
  h["b"]["data_offsets"] = {28, 36};
  expect_error(h.dump(), 36, {"hole of 4 bytes", "[24, 28)", "\"b\""});
}
TEST(SafetensorsBad, HoleAtStart) {
  json h = json{{"a", {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {4, 8}}}}};
  expect_error(h.dump(), 8, {"hole of 4 bytes", "[0, 4)"});
}
TEST(SafetensorsBad, BytesAfterLastTensor) {
  expect_error(valid_header().dump(), 40, {"8 bytes after the last tensor"});
}
TEST(SafetensorsBad, DuplicateTensorName) {
  const std::string h = R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                        R"( "a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})";
  expect_error(h, 8, {"duplicate key \"a\""});
}
TEST(SafetensorsBad, MetadataNotObject) {
  json h = valid_header();
  h["__metadata__"] = json::array({"x"});
  expect_error(h.dump(), 32, {"__metadata__", "must be an object"});
}
TEST(SafetensorsBad, MetadataValueNotString) {
  json h = valid_header();
  h["__metadata__"]["step"] = 5;
  expect_error(h.dump(), 32, {"__metadata__", "\"step\"", "5"});
}

// Every truncation of a valid file is refused cleanly (run under ASan this also checks the reads).
TEST(SafetensorsBad, EveryTruncationRefused) {
  const std::vector<uint8_t> bytes = make_file(valid_header().dump(), 32);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(File::parse(cut, "cut.safetensors").ok()) << "length " << n;
  }
}

// Every single-byte corruption of the header either parses to a consistent file or is refused.
TEST(SafetensorsBad, ByteFlipsNeverCrash) {
  const std::vector<uint8_t> bytes = make_file(valid_header().dump(), 32);
  for (size_t i = 0; i < bytes.size() - 32; ++i) {
    for (uint8_t v : {uint8_t{0}, uint8_t{'"'}, uint8_t{'9'}, uint8_t{0xff}}) {
      std::vector<uint8_t> bad = bytes;
      bad[i] = v;
      auto r = File::parse(bad, "flip.safetensors");
      if (!r.ok()) continue;
      for (const Tensor& t : r->tensors()) {
        EXPECT_GE(t.data.data(), bad.data() + r->data_offset());
        EXPECT_LE(t.data.data() + t.data.size(), bad.data() + bad.size());
      }
    }
  }
}

// Random multi-byte corruptions (a fixed seed, so failures reproduce): refused, or consistent.
TEST(SafetensorsBad, RandomMutationsNeverCrash) {
  json h = valid_header();
  h["c"] = {{"dtype", "I64"}, {"shape", {1, 2}}, {"data_offsets", {32, 48}}};
  const std::vector<uint8_t> bytes = make_file(h.dump(), 48);
  std::mt19937 rng(1234);
  const char alphabet[] = "{}[]\",:0123456789-eE. \\u\xff";
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bad = bytes;
    const int n_mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mutations; ++m) {
      const size_t pos = rng() % (bad.size() - 48);  // header and length field only
      bad[pos] = static_cast<uint8_t>(rng() % 2 ? alphabet[rng() % (sizeof(alphabet) - 1)] : rng() % 256);
    }
    if (rng() % 8 == 0) bad.resize(rng() % bad.size());
    auto r = File::parse(bad, "rand.safetensors");
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
      continue;
    }
    ++accepted;
    uint64_t covered = 0;
    for (const Tensor& t : r->tensors()) {
      EXPECT_GE(t.data.data(), bad.data() + r->data_offset());
      EXPECT_LE(t.data.data() + t.data.size(), bad.data() + bad.size());
      covered += t.data.size();
    }
    EXPECT_EQ(covered, bad.size() - r->data_offset());  // the tensors tile the data section
  }
  EXPECT_LT(accepted, 3000);
}

// ---- Files on disk: pickles and sharded folders.

class SafetensorsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_st_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream out(dir_ / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  void write_text(const std::string& name, const std::string& text) {
    write(name, std::vector<uint8_t>(text.begin(), text.end()));
  }
  // A shard holding U8 tensors of 4 bytes each, named `names`.
  void write_shard(const std::string& file, const std::vector<std::string>& names) {
    json h = json::object();
    for (size_t i = 0; i < names.size(); ++i) {
      h[names[i]] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {4 * i, 4 * i + 4}}};
    }
    write(file, make_file(h.dump(), 4 * names.size()));
  }
  void write_index(const json& weight_map) {
    write_text("model.safetensors.index.json",
               json{{"metadata", {{"total_size", 12}}}, {"weight_map", weight_map}}.dump());
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }

  // The standard two-shard layout: x, y in shard 1; z in shard 2.
  void write_two_shards() {
    write_shard("model-00001-of-00002.safetensors", {"x", "y"});
    write_shard("model-00002-of-00002.safetensors", {"z"});
  }
  json two_shard_map() const {
    return json{{"x", "model-00001-of-00002.safetensors"},
                {"y", "model-00001-of-00002.safetensors"},
                {"z", "model-00002-of-00002.safetensors"}};
  }

  static void expect_error_has(const Result<Model>& r, std::vector<std::string> needles) {
    ASSERT_FALSE(r.ok());
    for (const std::string& n : needles) {
      EXPECT_NE(r.status().message().find(n), std::string::npos)
          << "message lacks \"" << n << "\": " << r.status().message();
    }
  }

  fs::path dir_;
};

TEST_F(SafetensorsDir, OpenMapsTheFile) {
  write("model.safetensors", make_file(valid_header().dump(), 32));
  auto r = File::open(path("model.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find("b")->data[1], static_cast<uint8_t>(25 * 7 + 1));
  auto m = Model::open_dir(dir());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->n_tensors(), 2u);
  EXPECT_NE(m->find("a"), nullptr);
}

TEST_F(SafetensorsDir, PicklesRefusedByName) {
  write_text("pytorch_model.bin", "anything");
  for (const char* name : {"pytorch_model.bin", "model.pt", "model.pth", "last.ckpt"}) {
    auto r = File::open(path(name));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("does not load pickles"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("safetensors"), std::string::npos) << r.status().message();
  }
  expect_error_has(Model::open_dir(dir()), {"pytorch_model.bin", "does not load pickles"});
}

TEST_F(SafetensorsDir, PicklesRefusedByContent) {
  write("zip.safetensors", {'P', 'K', 3, 4, 20, 0, 0, 0, 8, 0, 1, 2, 3});
  write("raw.safetensors", {0x80, 0x02, 0x7d, 0x71, 0x00, 0x28, 0x58, 0x01, 0x00, 0x00});
  for (const char* name : {"zip.safetensors", "raw.safetensors"}) {
    auto r = File::open(path(name));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("does not load pickles"), std::string::npos) << r.status().message();
  }
}

TEST_F(SafetensorsDir, MissingFileAndEmptyFolder) {
  auto r = File::open(path("nope.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::not_found);
  auto m = Model::open_dir(dir());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::not_found);
  EXPECT_FALSE(Model::open_dir(path("no_such_dir")).ok());
}

TEST_F(SafetensorsDir, ShardedModelMergesShards) {
  write_two_shards();
  write_index(two_shard_map());
  auto m = Model::open_dir(dir());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->shards().size(), 2u);
  ASSERT_EQ(m->n_tensors(), 3u);
  EXPECT_EQ(m->tensors()[0]->name, "x");
  EXPECT_EQ(m->tensors()[2]->name, "z");
  EXPECT_EQ(m->find("z"), m->shards()[1].find("z"));
  EXPECT_EQ(m->find("w"), nullptr);
  Model moved = std::move(m).value();  // pointers stay valid after a move
  EXPECT_EQ(moved.find("y")->data.size(), 4u);
}

TEST_F(SafetensorsDir, IndexPointsAtMissingShard) {
  write_two_shards();
  json wm = two_shard_map();
  wm["z"] = "model-00003-of-00003.safetensors";
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"model-00003-of-00003.safetensors", "missing"});
}

TEST_F(SafetensorsDir, ShardLacksTensor) {
  write_two_shards();
  json wm = two_shard_map();
  wm["w"] = "model-00002-of-00002.safetensors";
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"lacks tensor \"w\"", "model-00002-of-00002.safetensors"});
}

TEST_F(SafetensorsDir, TensorInTwoShards) {
  write_shard("model-00001-of-00002.safetensors", {"x", "y"});
  write_shard("model-00002-of-00002.safetensors", {"y", "z"});
  write_index(two_shard_map());
  expect_error_has(Model::open_dir(dir()), {"\"y\"", "two shards"});
}

TEST_F(SafetensorsDir, TensorInWrongShard) {
  write_two_shards();
  json wm = two_shard_map();
  wm["z"] = "model-00001-of-00002.safetensors";
  wm["x"] = "model-00002-of-00002.safetensors";
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"weight_map puts tensor"});
}

TEST_F(SafetensorsDir, TensorNotInWeightMap) {
  write_two_shards();
  json wm = two_shard_map();
  wm.erase("y");
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"\"y\"", "not in weight_map"});
}

TEST_F(SafetensorsDir, ShardNameIsAPath) {
  write_two_shards();
  json wm = two_shard_map();
  wm["z"] = "../model-00002-of-00002.safetensors";
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"not a plain file name"});
  wm["z"] = "pytorch_model-00002-of-00002.bin";
  write_index(wm);
  expect_error_has(Model::open_dir(dir()), {"does not load pickles"});
}

TEST_F(SafetensorsDir, BadIndexJson) {
  write_two_shards();
  write_text("model.safetensors.index.json", "{\"weight_map\": {\"x\": 1}}");
  expect_error_has(Model::open_dir(dir()), {"weight_map[\"x\"]", "1"});
  write_text("model.safetensors.index.json", "{\"weight_map\": [\"x\"]}");
  expect_error_has(Model::open_dir(dir()), {"\"weight_map\" must be an object"});
  write_text("model.safetensors.index.json", "{\"metadata\": {}}");
  expect_error_has(Model::open_dir(dir()), {"missing field \"weight_map\""});
  write_text("model.safetensors.index.json",
             "{\"weight_map\": {\"x\": \"a.safetensors\", \"x\": \"b.safetensors\"}}");
  expect_error_has(Model::open_dir(dir()), {"duplicate key \"x\"", "/weight_map"});
  write_text("model.safetensors.index.json", "{\"weight_map\": \n  {\"x\" \"a\"}}");
  expect_error_has(Model::open_dir(dir()), {"model.safetensors.index.json:2:"});
}

TEST_F(SafetensorsDir, SeveralFilesWithoutIndex) {
  write_two_shards();
  expect_error_has(Model::open_dir(dir()), {"2 .safetensors files", "index"});
}

}  // namespace
}  // namespace kiln::safetensors
