// Test driver for tests/python/test_gguf.py.
//   gguf_driver dump FILE.gguf           -> JSON on stdout: version, alignment, data_offset,
//       metadata [{key, type, value, elem_type?}] in file order, tensors [{name, shape, type, offset,
//       n_bytes}]
//   gguf_driver roundtrip IN.gguf OUT.gguf -> reads IN, writes its metadata and tensors to OUT with the
//   Writer
// Errors go to stderr and exit with status 1.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf.h"

namespace {

using kiln::gguf::Value;
using kiln::gguf::ValueType;

nlohmann::json to_json(const Value& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  if (const auto* s = std::get_if<std::string>(&v.v)) return *s;
  nlohmann::json arr = nlohmann::json::array();
  for (const Value& item : v.as_array()->items) arr.push_back(to_json(item));
  return arr;
}

int dump(const std::string& path) {
  auto f = kiln::gguf::File::open(path);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
    return 1;
  }
  nlohmann::json out;
  out["version"] = f->version();
  out["alignment"] = f->alignment();
  out["data_offset"] = f->data_offset();
  nlohmann::json md = nlohmann::json::array();
  for (const auto& [key, v] : f->metadata()) {
    nlohmann::json e{{"key", key}, {"type", value_type_name(v.type)}, {"value", to_json(v)}};
    if (const auto* a = v.as_array()) e["elem_type"] = value_type_name(a->elem_type);
    md.push_back(std::move(e));
  }
  out["metadata"] = std::move(md);
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : f->tensors()) {
    ts.push_back({{"name", t.name},
                  {"shape", t.shape},
                  {"type", kiln::dtype_name(t.type)},
                  {"offset", t.offset},
                  {"n_bytes", t.n_bytes}});
  }
  out["tensors"] = std::move(ts);
  std::string s = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

int roundtrip(const std::string& in, const std::string& out) {
  auto f = kiln::gguf::File::open(in);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", f.status().to_string().c_str());
    return 1;
  }
  kiln::gguf::Writer w(f->alignment());
  kiln::Status st = copy_into(*f, w);
  if (st.ok()) st = w.write(out);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "dump") return dump(argv[2]);
  if (argc == 4 && std::string(argv[1]) == "roundtrip") return roundtrip(argv[2], argv[3]);
  std::fprintf(stderr, "usage: gguf_driver dump FILE | gguf_driver roundtrip IN OUT\n");
  return 2;
}
