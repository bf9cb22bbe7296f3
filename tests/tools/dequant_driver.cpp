// Test driver for tests/python/test_dequant.py: exposes the dtype table and the reference
// (de)quantizers of src/core to the gguf Python package's numpy reference.
//
//   dequant_driver table                          JSON array of every table entry, on stdout
//   dequant_driver dequantize TYPE in.bin out.bin blocks of TYPE -> little-endian f32
//   dequant_driver quantize TYPE in.bin out.bin   little-endian f32 -> blocks of TYPE
//   dequant_driver quantize-rows TYPE in.bin out.bin N_PER_ROW [importance.bin]
//                                                 rows of N_PER_ROW f32 -> rows of TYPE (quantize_rows), with
//                                                 N_PER_ROW f32 importance weights when given
// TYPE is a name ("q4_k"). Errors go to stderr with exit status 1.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace {

bool read_file(const char* path, std::vector<char>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

bool write_file(const char* path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  return static_cast<bool>(f);
}

int print_table() {
  int count = 0;
  const kiln::DTypeInfo* table = kiln::dtype_table(&count);
  nlohmann::json out = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    const kiln::DTypeInfo& t = table[i];
    out.push_back({{"name", t.name},
                   {"id", static_cast<uint32_t>(t.type)},
                   {"block_size", t.block_size},
                   {"type_size", t.type_size},
                   {"is_quantized", t.is_quantized},
                   {"dequantize", t.dequantize_row != nullptr},
                   {"quantize", t.quantize_row != nullptr},
                   {"quantize_rows", t.quantize_rows != nullptr},
                   {"requires_importance", t.requires_importance},
                   {"gguf", t.gguf}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "dequant_driver: %s\n", message.c_str());
  return 1;
}

// in.bin holds whole blocks of `info`; out.bin gets n_blocks * block_size floats.
int dequantize(const kiln::DTypeInfo& info, const std::vector<char>& in, const char* out_path) {
  if (info.dequantize_row == nullptr) return fail(std::string("no dequantizer for ") + info.name);
  if (in.size() % static_cast<size_t>(info.type_size) != 0) return fail("input is not whole blocks");
  const int64_t n = static_cast<int64_t>(in.size()) / info.type_size * info.block_size;
  std::vector<float> out(static_cast<size_t>(n));
  info.dequantize_row(in.data(), out.data(), n);
  return write_file(out_path, out.data(), out.size() * sizeof(float)) ? 0 : fail("cannot write output");
}

// in.bin holds a multiple of block_size floats; out.bin gets the blocks.
int quantize(const kiln::DTypeInfo& info, const std::vector<char>& in, const char* out_path) {
  if (info.quantize_row == nullptr) return fail(std::string("no quantizer for ") + info.name);
  if (in.size() % (sizeof(float) * static_cast<size_t>(info.block_size)) != 0) {
    return fail("input is not a whole number of blocks of f32");
  }
  const int64_t n = static_cast<int64_t>(in.size() / sizeof(float));
  std::vector<float> src(static_cast<size_t>(n));
  std::copy(in.begin(), in.end(), reinterpret_cast<char*>(src.data()));
  std::vector<char> out(static_cast<size_t>(n / info.block_size * info.type_size));
  info.quantize_row(src.data(), out.data(), n);
  return write_file(out_path, out.data(), out.size()) ? 0 : fail("cannot write output");
}

// in.bin holds rows of n_per_row floats; out.bin gets the rows of `info`.
int quantize_rows(const kiln::DTypeInfo& info, const std::vector<char>& in, const char* out_path,
                  int64_t n_per_row, const char* importance_path) {
  if (info.quantize_rows == nullptr) return fail(std::string("no row quantizer for ") + info.name);
  if (n_per_row <= 0 || n_per_row % info.block_size != 0)
    return fail("N_PER_ROW is not a whole number of blocks");
  const size_t row_floats = static_cast<size_t>(n_per_row);
  if (in.size() % (sizeof(float) * row_floats) != 0)
    return fail("input is not a whole number of rows of f32");
  const int64_t n_rows = static_cast<int64_t>(in.size() / sizeof(float) / row_floats);
  std::vector<float> src(in.size() / sizeof(float));
  std::copy(in.begin(), in.end(), reinterpret_cast<char*>(src.data()));
  std::vector<float> importance;
  if (importance_path != nullptr) {
    std::vector<char> bytes;
    if (!read_file(importance_path, &bytes)) return fail(std::string("cannot read ") + importance_path);
    if (bytes.size() != sizeof(float) * row_floats) return fail("importance is not N_PER_ROW f32");
    importance.resize(row_floats);
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(importance.data()));
  } else if (info.requires_importance) {
    return fail(std::string(info.name) + " requires importance weights");
  }
  std::vector<char> out(static_cast<size_t>(n_rows * (n_per_row / info.block_size) * info.type_size));
  info.quantize_rows(src.data(), out.data(), n_rows, n_per_row,
                     importance.empty() ? nullptr : importance.data());
  return write_file(out_path, out.data(), out.size()) ? 0 : fail("cannot write output");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "table") return print_table();
  if (argc >= 6 && std::string(argv[1]) == "quantize-rows") {
    const auto type = kiln::dtype_from_name(argv[2]);
    if (!type) return fail(std::string("unknown type ") + argv[2]);
    std::vector<char> in;
    if (!read_file(argv[3], &in)) return fail(std::string("cannot read ") + argv[3]);
    return quantize_rows(kiln::dtype_info(*type), in, argv[4], std::atoll(argv[5]),
                         argc >= 7 ? argv[6] : nullptr);
  }
  if (argc != 5) {
    return fail(
        "usage: dequant_driver table | (dequantize|quantize) TYPE in.bin out.bin | quantize-rows TYPE in.bin "
        "out.bin N_PER_ROW [importance.bin]");
  }
  const std::string mode = argv[1];
  const auto type = kiln::dtype_from_name(argv[2]);
  if (!type) return fail(std::string("unknown type ") + argv[2]);
  std::vector<char> in;
  if (!read_file(argv[3], &in)) return fail(std::string("cannot read ") + argv[3]);
  const kiln::DTypeInfo& info = kiln::dtype_info(*type);
  if (mode == "dequantize") return dequantize(info, in, argv[4]);
  if (mode == "quantize") return quantize(info, in, argv[4]);
  return fail("unknown mode " + mode);
}
