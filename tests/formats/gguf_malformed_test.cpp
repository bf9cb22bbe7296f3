// Malformed GGUF files built in memory, one per class of bad input: each must be rejected with a
// message naming the offending field (and the file name), never a crash. Also checks that a valid
// file parses and its getters behave.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "formats/gguf.h"
#include "gguf_test_util.h"

namespace kiln::gguf {
namespace {

using testing::Buf;
using testing::kv;
using testing::kv_str;
using testing::kv_u32;
using testing::Spec;
using testing::tinfo;
using testing::valid_spec;

struct Case {
  const char* name;
  std::function<std::vector<uint8_t>()> make;
  const char* expect;  // a substring the error message must contain
};

Spec with(const std::function<void(Spec&)>& edit) {
  Spec s = valid_spec();
  edit(s);
  return s;
}
std::function<std::vector<uint8_t>()> edited(std::function<void(Spec&)> edit) {
  return [edit] { return testing::build(with(edit)); };
}
// An array payload: u32 elem type, u64 count, then raw elements.
Buf array_payload(uint32_t elem, uint64_t count, const Buf& elems) {
  Buf b;
  b.put(elem).put(count).raw(elems.b);
  return b;
}

std::vector<Case> cases() {
  constexpr uint64_t kHuge = uint64_t{1} << 62;
  return {
      {"bad_magic", edited([](Spec& s) { s.magic = 0x46554746; }), "magic"},
      {"version_1", edited([](Spec& s) { s.version = 1; }), "version 1"},
      {"version_4", edited([](Spec& s) { s.version = 4; }), "version at offset 4: 4"},
      {"version_0", edited([](Spec& s) { s.version = 0; }), "version at offset 4: 0"},
      {"big_endian", edited([](Spec& s) { s.version = 0x03000000; }), "byte-swapped"},
      {"truncated_header", [] { return Buf().put<uint32_t>(0x46554747).put<uint32_t>(3).put<uint16_t>(0).b; },
       "n_tensors at offset 8"},
      {"empty_file", [] { return std::vector<uint8_t>(); }, "magic at offset 0"},
      {"n_kv_too_large", edited([](Spec& s) { s.n_kv = static_cast<int64_t>(kHuge); }), "n_kv"},
      {"n_tensors_too_large", edited([](Spec& s) { s.n_tensors = static_cast<int64_t>(kHuge); }),
       "n_tensors"},
      {"n_kv_one_too_many", edited([](Spec& s) {
         s.n_kv = 3;
         s.tinfos.clear();
         s.data_bytes = 0;
       }),
       "metadata key #2 at offset 95: needs 8 bytes"},
      {"key_length_past_end", edited([](Spec& s) { s.kvs[0] = Buf().put<uint64_t>(kHuge).b; }),
       "metadata key #0 at offset 24: string length"},
      {"empty_key", edited([](Spec& s) { s.kvs[0] = kv_u32("", 1); }),
       "metadata key #0 at offset 24: the key is empty"},
      {"key_bad_utf8", edited([](Spec& s) { s.kvs[1] = kv_u32("a\xff", 1); }), "metadata key #1"},
      {"key_overlong_utf8", edited([](Spec& s) { s.kvs[1] = kv_u32("a\xc0\x80", 1); }), "not valid UTF-8"},
      {"key_surrogate_utf8", edited([](Spec& s) { s.kvs[1] = kv_u32("a\xed\xa0\x80", 1); }),
       "not valid UTF-8"},
      {"key_truncated_utf8", edited([](Spec& s) { s.kvs[1] = kv_u32("a\xe2\x82", 1); }), "not valid UTF-8"},
      {"duplicate_key", edited([](Spec& s) { s.kvs[1] = kv_str("general.architecture", "x"); }),
       "'general.architecture' at offset 69: duplicate key"},
      {"unknown_value_type", edited([](Spec& s) { s.kvs[1] = kv("test.count", 13, Buf().put<uint32_t>(0)); }),
       "metadata 'test.count' at offset 87: value type 13"},
      {"string_value_past_end",
       edited([](Spec& s) { s.kvs[1] = kv("test.count", 8, Buf().put<uint64_t>(1000)); }),
       "metadata 'test.count' at offset 91: string length 1000"},
      {"value_truncated",
       [] {
         return testing::build(with([](Spec& s) {
           s.tinfos.clear();
           s.data_bytes = 0;
           s.kvs[1] = kv("test.count", 4, Buf().put<uint16_t>(7));
         }));
       },
       "metadata 'test.count' at offset 91: needs 4 bytes"},
      {"array_count_past_end",
       edited([](Spec& s) { s.kvs[1] = kv("test.arr", 9, array_payload(4, kHuge, Buf())); }), "array count"},
      {"array_elem_type_unknown",
       edited([](Spec& s) { s.kvs[1] = kv("test.arr", 9, array_payload(77, 1, Buf().put<uint32_t>(0))); }),
       "array element type 77"},
      {"array_of_strings_past_end", edited([](Spec& s) {
         s.kvs[1] = kv("test.arr", 9, array_payload(8, 2, Buf().str("a").put<uint64_t>(kHuge)));
       }),
       "metadata 'test.arr'"},
      {"array_nesting_too_deep", edited([](Spec& s) {
         Buf p;
         for (int i = 0; i < 20; ++i) p.put<uint32_t>(9).put<uint64_t>(1);
         p.put<uint32_t>(4).put<uint64_t>(0);
         s.kvs[1] = kv("test.deep", 9, p);
       }),
       "nested deeper"},
      {"bool_not_0_or_1", edited([](Spec& s) { s.kvs[1] = kv("test.flag", 7, Buf().put<uint8_t>(2)); }),
       "metadata 'test.flag' at offset 90: bool value 2"},
      {"alignment_wrong_type",
       edited([](Spec& s) { s.kvs[1] = kv("general.alignment", 10, Buf().put<uint64_t>(32)); }),
       "'general.alignment' has type uint64"},
      {"alignment_zero", edited([](Spec& s) { s.kvs[1] = kv_u32("general.alignment", 0); }),
       "'general.alignment' = 0"},
      {"alignment_not_power_of_two", edited([](Spec& s) { s.kvs[1] = kv_u32("general.alignment", 48); }),
       "'general.alignment' = 48"},
      {"n_dims_5", edited([](Spec& s) {
         s.tinfos[0] = tinfo("t", {1, 1, 1, 1, 4}, 0, 0);
       }),
       "n_dims = 5"},
      {"n_dims_0", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {}, 0, 0); }), "n_dims = 0"},
      {"dim_zero", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {0}, 0, 0); }),
       "dims[0] = 0 is not positive"},
      {"dim_negative", edited([](Spec& s) {
         s.tinfos[0] = tinfo("t", {4, static_cast<uint64_t>(-5)}, 0, 0);
       }),
       "tensor 't' at offset 116: dims[1] = -5 is not positive"},
      {"element_count_overflow", edited([](Spec& s) {
         s.tinfos[0] = tinfo("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
       }),
       "element count overflows"},
      {"byte_size_overflow", edited([](Spec& s) {
         s.tinfos[0] = tinfo("t", {uint64_t{1} << 20, uint64_t{1} << 42}, 0, 0);
       }),
       "byte size"},
      {"retired_type_id", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {4}, 4, 0); }), "type = 4"},
      {"unknown_type_id", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {4}, 1000, 0); }), "type = 1000"},
      {"row_not_block_multiple", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {33}, 2, 0); }),
       "dims[0] = 33 is not a multiple of the q4_0 block size 32"},
      {"misaligned_offset", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {4}, 0, 4); }), "data offset = 4"},
      {"overlapping_tensors", edited([](Spec& s) {
         s.tinfos = {tinfo("a", {8}, 0, 0), tinfo("b", {8}, 0, 0)};
         s.data_bytes = 64;
       }),
       "overlaps tensor"},
      {"tensor_past_end", edited([](Spec& s) { s.tinfos[0] = tinfo("t", {16}, 0, 0); }),
       "tensor 't': data offset 0 + 64"},
      {"data_section_missing", edited([](Spec& s) { s.data_bytes = 0; }), "tensor 't'"},
      {"duplicate_tensor_name", edited([](Spec& s) {
         s.tinfos = {tinfo("t", {4}, 0, 0), tinfo("t", {4}, 0, 32)};
         s.data_bytes = 64;
       }),
       "tensor 't' at offset 128: duplicate tensor name"},
      {"empty_tensor_name", edited([](Spec& s) { s.tinfos[0] = tinfo("", {4}, 0, 0); }),
       "tensor info #0 name"},
      {"tensor_name_bad_utf8", edited([](Spec& s) { s.tinfos[0] = tinfo("t\x80", {4}, 0, 0); }),
       "tensor info #0 name at offset 95: the name is not valid UTF-8"},
      {"tensor_name_past_end", edited([](Spec& s) { s.tinfos[0] = Buf().put<uint64_t>(kHuge).b; }),
       "tensor info #0 name at offset 95: string length"},
      {"tensor_info_truncated",
       [] {
         auto b = testing::build(with([](Spec& s) { s.data_bytes = 0; }));
         b.resize(b.size() - 10);
         return b;
       },
       "tensor 't' type at offset 116: needs 4 bytes"},
  };
}

TEST(GgufMalformed, EveryCaseIsRejectedNamingTheField) {
  auto all = cases();
  ASSERT_GE(all.size(), 30u);
  for (const Case& c : all) {
    std::vector<uint8_t> bytes = c.make();
    std::string file = std::string("case:") + c.name;
    auto r = File::parse(bytes, file);
    ASSERT_FALSE(r.ok()) << c.name << " was accepted";
    const std::string& msg = r.status().message();
    EXPECT_NE(msg.find(c.expect), std::string::npos)
        << c.name << ": message '" << msg << "' lacks '" << c.expect << "'";
    EXPECT_EQ(msg.rfind(file + ": ", 0), 0u)
        << c.name << ": message '" << msg << "' lacks the file name prefix";
  }
}

TEST(GgufMalformed, MetadataMemoryCapIsPerProcess) {
  Spec s = valid_spec();
  s.kvs[1] = kv_str("test.big", std::string(100000, 'x'));
  auto bytes = testing::build(s);
  uint64_t base = metadata_memory_in_use();
  auto first = File::parse(bytes, "cap");
  ASSERT_TRUE(first.ok()) << first.status().message();
  uint64_t one = metadata_memory_in_use() - base;
  EXPECT_GE(one, 100000u);
  uint64_t old_cap = metadata_memory_cap();
  set_metadata_memory_cap(base + one + one / 2);  // room for one such file, not two
  auto second = File::parse(bytes, "cap");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::resource_exhausted);
  EXPECT_NE(second.status().message().find("metadata 'test.big'"), std::string::npos)
      << second.status().message();
  EXPECT_EQ(metadata_memory_in_use(), base + one);  // the failed parse gave its reservation back
  { File gone = std::move(*first); }
  EXPECT_EQ(metadata_memory_in_use(), base);
  auto third = File::parse(bytes, "cap");
  set_metadata_memory_cap(old_cap);
  EXPECT_TRUE(third.ok()) << third.status().message();
}

TEST(GgufMalformed, ValidFileParsesAndGettersCheckTypes) {
  Spec s = valid_spec();
  s.kvs.push_back(kv("test.neg", 5, Buf().put<int32_t>(-3)));
  s.kvs.push_back(kv("test.f", 6, Buf().put<float>(0.5f)));
  s.kvs.push_back(kv("test.flag", 7, Buf().put<uint8_t>(1)));
  s.kvs.push_back(kv("test.strs", 9, array_payload(8, 2, Buf().str("a").str("bc"))));
  s.kvs.push_back(kv("test.ints", 9, array_payload(5, 2, Buf().put<int32_t>(-1).put<int32_t>(9))));
  s.version = 2;
  auto bytes = testing::build(s);
  auto r = File::parse(bytes, "valid");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const File& f = *r;
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.architecture(), "llama");
  EXPECT_EQ(*f.get_uint("test.count"), 7u);
  EXPECT_EQ(*f.get_int("test.neg"), -3);
  EXPECT_FALSE(f.get_uint("test.neg").ok());
  EXPECT_EQ(*f.get_float("test.f"), 0.5);
  EXPECT_EQ(*f.get_float("test.count"), 7.0);
  EXPECT_TRUE(*f.get_bool("test.flag"));
  EXPECT_EQ(*f.get_string_array("test.strs"), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(*f.get_int_array("test.ints"), (std::vector<int64_t>{-1, 9}));
  EXPECT_FALSE(f.get_int_array("test.strs").ok());
  EXPECT_EQ(f.get_string("nope").status().code(), StatusCode::not_found);
  auto wrong = f.get_string("test.count");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("'test.count'"), std::string::npos);
  EXPECT_EQ(*f.get_uint_or("nope", 5), 5u);
  EXPECT_FALSE(f.get_uint_or("test.strs", 5).ok());
  ASSERT_EQ(f.tensors().size(), 1u);
  const TensorInfo* t = f.find_tensor("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->n_bytes, 16u);
  EXPECT_EQ(t->n_elements(), 4);
  EXPECT_EQ(t->data, bytes.data() + f.data_offset());
  EXPECT_EQ(f.data_offset() % 32, 0u);
}

}  // namespace
}  // namespace kiln::gguf
