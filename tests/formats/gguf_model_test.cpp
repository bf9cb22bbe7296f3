// GGUF against a real model (SmolLM2-135M Q4_1 from KILN_MODELS_DIR): every truncation of its
// header is rejected cleanly, and read -> Writer -> read gives identical metadata and tensor bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "formats/gguf.h"
#include "gguf_test_util.h"

namespace kiln::gguf {
namespace {

std::string model_path() {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  std::string d =
      dir != nullptr && *dir != '\0' ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln/models";
  return d + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

bool same_value(const Value& a, const Value& b) {
  if (a.type != b.type || a.v.index() != b.v.index()) return false;
  const Array* x = a.as_array();
  const Array* y = b.as_array();
  if (x == nullptr) return a.v == b.v;
  if (x->elem_type != y->elem_type || x->items.size() != y->items.size()) return false;
  for (size_t i = 0; i < x->items.size(); ++i) {
    if (!same_value(x->items[i], y->items[i])) return false;
  }
  return true;
}

void expect_same_file(const File& a, const File& b) {
  ASSERT_EQ(a.metadata().size(), b.metadata().size());
  for (size_t i = 0; i < a.metadata().size(); ++i) {
    EXPECT_EQ(a.metadata()[i].first, b.metadata()[i].first);
    EXPECT_TRUE(same_value(a.metadata()[i].second, b.metadata()[i].second)) << a.metadata()[i].first;
  }
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorInfo& x = a.tensors()[i];
    const TensorInfo& y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.shape, y.shape) << x.name;
    EXPECT_EQ(x.type, y.type) << x.name;
    ASSERT_EQ(x.n_bytes, y.n_bytes) << x.name;
    EXPECT_EQ(std::memcmp(x.data, y.data, x.n_bytes), 0) << x.name;
  }
}

TEST(GgufModel, RoundTripThroughWriter) {
  auto orig = File::open(model_path());
  ASSERT_TRUE(orig.ok()) << orig.status().message();
  EXPECT_EQ(orig->architecture(), "llama");
  ASSERT_GT(orig->tensors().size(), 100u);
  Writer w(orig->alignment());
  ASSERT_TRUE(copy_into(*orig, w).ok());
  std::string out = (std::filesystem::temp_directory_path() / "kiln_gguf_roundtrip_test.gguf").string();
  Status st = w.write(out);
  ASSERT_TRUE(st.ok()) << st.message();
  auto again = File::open(out);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->version(), 3u);
  expect_same_file(*orig, *again);
  std::filesystem::remove(out);
}

TEST(GgufModel, LazyTensorsStreamTheSameFile) {
  Writer eager, lazy;
  std::vector<uint8_t> a(40), b(6);  // 10 f32, 3 f16: b needs padding
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(200 + i);
  for (Writer* w : {&eager, &lazy}) w->set("general.architecture", Value::str("test"));
  ASSERT_TRUE(eager.add_tensor("a", {10}, DType::f32, a).ok());
  ASSERT_TRUE(eager.add_tensor("b", {3}, DType::f16, b).ok());
  int calls = 0;
  auto fill_from = [&calls](const std::vector<uint8_t>& src) {
    return [&calls, &src](std::span<uint8_t> out) {
      ++calls;
      if (out.size() != src.size())
        return invalid_argument("fill: {} bytes asked, {} held", out.size(), src.size());
      std::memcpy(out.data(), src.data(), out.size());
      return Status();
    };
  };
  ASSERT_TRUE(lazy.add_tensor_lazy("a", {10}, DType::f32, fill_from(a)).ok());
  ASSERT_TRUE(lazy.add_tensor_lazy("b", {3}, DType::f16, fill_from(b)).ok());
  EXPECT_FALSE(lazy.add_tensor_lazy("c", {3}, DType::f16, nullptr).ok());
  const std::string dir = std::filesystem::temp_directory_path().string();
  ASSERT_TRUE(eager.write(dir + "/kiln_eager.gguf").ok());
  ASSERT_TRUE(lazy.write(dir + "/kiln_lazy.gguf").ok());
  EXPECT_EQ(calls, 2);
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(dir + "/kiln_eager.gguf"), read(dir + "/kiln_lazy.gguf"));
  EXPECT_EQ(eager.to_bytes().value(), lazy.to_bytes().value());
  // A fill that fails aborts the write and leaves no file.
  Writer failing;
  ASSERT_TRUE(
      failing
          .add_tensor_lazy("x", {4}, DType::f32, [](std::span<uint8_t>) { return io_error("source gone"); })
          .ok());
  const Status st = failing.write(dir + "/kiln_failing.gguf");
  EXPECT_EQ(st.message(), "source gone");
  EXPECT_FALSE(std::filesystem::exists(dir + "/kiln_failing.gguf"));
  std::filesystem::remove(dir + "/kiln_eager.gguf");
  std::filesystem::remove(dir + "/kiln_lazy.gguf");
}

TEST(GgufModel, WriterRejectsBadTensors) {
  Writer w;
  std::vector<uint8_t> data(16);
  EXPECT_TRUE(w.add_tensor("a", {4}, DType::f32, data).ok());
  EXPECT_FALSE(w.add_tensor("a", {4}, DType::f32, data).ok());   // duplicate
  EXPECT_FALSE(w.add_tensor("b", {5}, DType::f32, data).ok());   // byte count
  EXPECT_FALSE(w.add_tensor("c", {4}, DType::q4_0, data).ok());  // not a block multiple
  EXPECT_FALSE(w.add_tensor("d", {1, 1, 1, 1, 4}, DType::f32, data).ok());
  // kiln's in-memory FP8 form has no GGUF type: refused, eager or lazy, with the tensor named.
  std::vector<uint8_t> fp8(36);
  for (const Status& st : {w.add_tensor("blk.0.attn_q.weight", {32}, DType::f8_e4m3, fp8),
                           w.add_tensor_lazy("blk.0.attn_k.weight", {32}, DType::f8_e4m3,
                                             [](std::span<uint8_t>) { return Status(); })}) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("FP8 weights have no GGUF type"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(".attn_"), std::string::npos) << st.message();
  }
  w.set("general.alignment", Value::u32(64));
  EXPECT_FALSE(w.to_bytes().ok());  // disagrees with the writer's alignment 32
  Writer w64(64);
  w64.set("k", Value::array(ValueType::array, {Value::array(ValueType::int8, {Value::i8(-1)})}));
  ASSERT_TRUE(w64.add_tensor("a", {4}, DType::f32, data).ok());
  ASSERT_TRUE(w64.add_tensor("b", {4}, DType::f32, data).ok());
  auto bytes = w64.to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto f = File::parse(*bytes, "w64");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->find_tensor("b")->offset, 64u);
  EXPECT_EQ(f->find("k")->as_array()->items[0].as_array()->items[0].to_display_string(), "-1");
}

// release() removes one entry and keeps the rest findable, in file order.
TEST(GgufModel, ReleaseForgetsOneEntry) {
  Writer w;
  w.set("general.architecture", Value::str("llama"));
  w.set("tokenizer.ggml.tokens", Value::array(ValueType::string, {Value::str("a"), Value::str("b")}));
  w.set("tokenizer.ggml.scores", Value::array(ValueType::float32, {Value::f32(0.5f), Value::f32(1.5f)}));
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto f = File::parse(*bytes, "release");
  ASSERT_TRUE(f.ok()) << f.status().message();
  const size_t n = f->metadata().size();
  f->release("tokenizer.ggml.tokens");
  f->release("no.such.key");  // nothing
  EXPECT_EQ(f->find("tokenizer.ggml.tokens"), nullptr);
  EXPECT_FALSE(f->get_string_array("tokenizer.ggml.tokens").ok());
  EXPECT_EQ(f->metadata().size(), n - 1);
  EXPECT_EQ(f->architecture(), "llama");
  ASSERT_TRUE(f->get_float_array("tokenizer.ggml.scores").ok());
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores")->at(1), 1.5);
  for (const auto& [key, value] : f->metadata()) EXPECT_NE(key, "tokenizer.ggml.tokens");
}

// Truncation coverage (the full header is ~2 MB, so re-parsing it at every byte is O(n^2)):
//  1. every byte of the first 64 KiB of the file (header and the first metadata keys/arrays);
//  2. every byte of the real tensor-info section, spliced behind a header with n_kv = 0 so each
//     parse costs only the tensor infos (the bytes of every tensor info are the model's own);
//  3. a stride of 4093 bytes across the whole header, plus the last 64 bytes before the tensor infos;
//  4. 64 points spread over the data section up to the end of the last tensor.
// Each truncated file must be rejected with an error that carries the file name.
TEST(GgufModel, EveryTruncationIsRejected) {
  auto full = File::open(model_path());
  ASSERT_TRUE(full.ok()) << full.status().message();
  std::span<const uint8_t> bytes = full->bytes();
  uint64_t info_start = full->tensor_infos_offset();
  uint64_t data_start = full->data_offset();
  uint64_t data_end = data_start;
  for (const TensorInfo& t : full->tensors())
    data_end = std::max(data_end, data_start + t.offset + t.n_bytes);
  auto t0 = std::chrono::steady_clock::now();
  size_t checked = 0;
  auto expect_rejected = [&](std::span<const uint8_t> b, size_t cut, const char* part) {
    auto r = File::parse(b.first(cut), "trunc");
    ++checked;
    if (r.ok()) {
      ADD_FAILURE() << part << ": truncation at " << cut << " was accepted";
      return false;
    }
    EXPECT_EQ(r.status().message().rfind("trunc: ", 0), 0u) << r.status().message();
    return true;
  };
  for (size_t cut = 0; cut < std::min<uint64_t>(65536, info_start); ++cut) {
    if (!expect_rejected(bytes, cut, "first 64 KiB")) return;
  }
  testing::Buf slim;
  slim.put<uint32_t>(0x46554747).put<uint32_t>(full->version());
  slim.put<uint64_t>(full->tensors().size()).put<uint64_t>(0);
  uint64_t slim_infos = slim.b.size();
  slim.b.insert(slim.b.end(), bytes.begin() + static_cast<ptrdiff_t>(info_start),
                bytes.begin() + static_cast<ptrdiff_t>(data_start));
  for (size_t cut = slim_infos; cut < slim_infos + (data_start - info_start); ++cut) {
    if (!expect_rejected(slim.b, cut, "tensor infos")) return;
  }
  for (size_t cut = 0; cut < data_start; cut += 4093) {
    if (!expect_rejected(bytes, cut, "header stride")) return;
  }
  for (size_t cut = info_start - 64; cut <= info_start + 64; ++cut) {
    if (!expect_rejected(bytes, cut, "around tensor infos")) return;
  }
  for (int i = 0; i < 64; ++i) {
    size_t cut = data_start + (data_end - data_start) * static_cast<uint64_t>(i) / 64;
    if (!expect_rejected(bytes, cut, "data section")) return;
  }
  if (!expect_rejected(bytes, data_end - 1, "data section")) return;
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("checked %zu truncations of a %llu-byte header in %.2f s\n", checked,
              static_cast<unsigned long long>(data_start), secs);
}

}  // namespace
}  // namespace kiln::gguf
