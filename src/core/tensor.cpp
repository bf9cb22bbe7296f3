#include "core/tensor.h"

#include <fmt/format.h>

namespace kiln {

int64_t Tensor::row_bytes() const {
  const DTypeInfo& info = dtype_info(type);
  return ne[0] / info.block_size * info.type_size;
}

bool Tensor::is_contiguous() const {
  const DTypeInfo& info = dtype_info(type);
  return nb[0] == info.type_size && nb[1] == row_bytes() && nb[2] == nb[1] * ne[1] && nb[3] == nb[2] * ne[2];
}

std::string Tensor::describe() const {
  std::string dims = fmt::format("{}", ne[0]);
  int last = 3;
  while (last > 0 && ne[last] == 1) --last;
  for (int i = 1; i <= last; ++i) dims += fmt::format(", {}", ne[i]);
  return fmt::format("{}[{}]", dtype_name(type), dims);
}

Tensor make_tensor(DType type, void* data, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  const DTypeInfo& info = dtype_info(type);
  KILN_ASSERT(ne0 % info.block_size == 0);
  Tensor t;
  t.type = type;
  t.data = data;
  t.ne = {ne0, ne1, ne2, ne3};
  t.nb[0] = info.type_size;
  t.nb[1] = ne0 / info.block_size * info.type_size;
  t.nb[2] = t.nb[1] * ne1;
  t.nb[3] = t.nb[2] * ne2;
  return t;
}

Tensor make_tensor(DType type, const Buffer& buffer, size_t offset, int64_t ne0, int64_t ne1, int64_t ne2,
                   int64_t ne3) {
  Tensor t = make_tensor(type, static_cast<uint8_t*>(const_cast<Buffer&>(buffer).data()) + offset, ne0, ne1, ne2,
                         ne3);
  KILN_ASSERT(offset + static_cast<size_t>(t.nb[3] * ne3) <= buffer.size());
  t.buffer = &buffer;
  return t;
}

Tensor reshape(const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  KILN_ASSERT(t.is_contiguous());
  KILN_ASSERT(ne0 * ne1 * ne2 * ne3 == t.n_elements());
  Tensor r = make_tensor(t.type, t.data, ne0, ne1, ne2, ne3);
  r.buffer = t.buffer;
  return r;
}

Tensor slice_rows(const Tensor& t, int64_t first, int64_t count) {
  KILN_ASSERT(first >= 0 && count >= 0 && first + count <= t.ne[1]);
  Tensor s = t;
  s.data = t.row(first);
  s.ne[1] = count;
  return s;
}

}  // namespace kiln
