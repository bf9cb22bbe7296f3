// Tensor: a non-owning view of an n-d array (up to 4 dims) in memory, ggml-style: ne[0] is the innermost,
// contiguous dimension; nb[i] is the byte stride of dimension i. For a block-quantized type a row (ne[0]
// elements) is a whole number of blocks, nb[0] is the block's byte size and nb[1] >= the row's bytes.
// Shapes are written innermost first everywhere in comments: f32 [head_dim, n_heads, n_tokens].
// `buffer` says where the memory lives: a backend buffer (core/buffer.h), or null for host memory no backend
// allocated (a memory-mapped file, a test's vector).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <span>

#include "core/buffer.h"
#include "core/dtype.h"

namespace kiln {

struct Tensor {
  DType type = DType::f32;
  void* data = nullptr;
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // elements per dimension, innermost first
  std::array<int64_t, 4> nb{0, 0, 0, 0};  // bytes between consecutive indices of each dimension
  const Buffer* buffer = nullptr;         // the backend buffer holding `data`, or null: plain host memory

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // Rows: every dimension but the first.
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  // Bytes of one row of ne[0] elements.
  int64_t row_bytes() const;
  // Rows are packed one after another and dims 1..3 are nested without gaps.
  bool is_contiguous() const;
  // Byte address of row (i1, i2, i3).
  uint8_t* row(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<uint8_t*>(data) + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
  }
  template <class T>
  T* row_as(int64_t i1, int64_t i2 = 0, int64_t i3 = 0) const {
    return reinterpret_cast<T*>(row(i1, i2, i3));
  }
  // Row r counted over dims 1..3 (r < n_rows()).
  uint8_t* flat_row(int64_t r) const { return row(r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2])); }
  // The elements of a contiguous tensor in host-visible memory, as T (sizeof(T) == the type's size).
  template <class T>
  std::span<T> span_as() const {
    return {static_cast<T*>(data), static_cast<size_t>(n_elements())};
  }
  // "f32[64, 9, 3]"
  std::string describe() const;
};

// A contiguous view of `data` with the given shape (innermost first; trailing dims default to 1).
// ne0 must be a multiple of the type's block size (asserted).
Tensor make_tensor(DType type, void* data, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);
// The same, in `buffer` at byte `offset` (the view records the buffer).
Tensor make_tensor(DType type, const Buffer& buffer, size_t offset, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                   int64_t ne3 = 1);
// The same memory viewed with dims 1..3 reshaped (the view must be contiguous; asserted).
Tensor reshape(const Tensor& t, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1);
// Rows [first, first + count) of dimension 1.
Tensor slice_rows(const Tensor& t, int64_t first, int64_t count);

}  // namespace kiln
