#include <functional>

#include "models/model.h"

namespace kiln {

namespace {

Result<KvBuffers> allocate_pools(const std::function<Backend&(int32_t)>& backend_of, const ModelInfo& info,
                                 int32_t block_size, int32_t n_blocks, DType dtype) {
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::q8_0 && dtype != DType::q8_64) {
    return invalid_argument("KV cache type {} is not supported (f32, f16, q8_0, q8_64)", dtype_name(dtype));
  }
  if (info.head_dim % dtype_info(dtype).block_size != 0) {
    return invalid_argument("KV cache type {}: head_dim {} is not a multiple of its {}-value blocks",
                            dtype_name(dtype), info.head_dim, dtype_info(dtype).block_size);
  }
  if (block_size <= 0 || n_blocks <= 0) {
    return invalid_argument("KV cache: block_size = {} and n_blocks = {} must be positive", block_size,
                            n_blocks);
  }
  KvBuffers kv;
  kv.block_size = block_size;
  kv.n_blocks = n_blocks;
  const int64_t elems = int64_t{info.head_dim} * info.n_kv_heads * block_size * n_blocks;
  KILN_ASSIGN_OR_RETURN(const int64_t pool_bytes, dtype_row_bytes(dtype, elems));
  const auto bytes = static_cast<size_t>(pool_bytes);
  for (int32_t l = 0; l < info.n_layers; ++l) {
    Backend& backend = backend_of(l);
    for (std::vector<Tensor>* pools : {&kv.k, &kv.v}) {
      auto buf = backend.allocate(bytes);
      if (!buf.ok()) {
        return resource_exhausted(
            "KV cache: cannot allocate layer {}'s 2 x {:.1f} MiB on {} ({} layers, {} blocks of {} tokens)",
            l, bytes / 1048576.0, backend.name(), info.n_layers, n_blocks, block_size);
      }
      pools->push_back(make_tensor(dtype, **buf, 0, info.head_dim, info.n_kv_heads, block_size, n_blocks));
      kv.storage.push_back(std::move(buf).value());
    }
  }
  return kv;
}

}  // namespace

Result<KvBuffers> KvBuffers::allocate(Backend& backend, const ModelInfo& info, int32_t block_size,
                                      int32_t n_blocks, DType dtype) {
  return allocate_pools([&](int32_t) -> Backend& { return backend; }, info, block_size, n_blocks, dtype);
}

Result<KvBuffers> KvBuffers::allocate(const Model& model, int32_t block_size, int32_t n_blocks, DType dtype) {
  return model.allocate_kv(block_size, n_blocks, dtype);
}

Result<KvBuffers> Model::allocate_kv(int32_t block_size, int32_t n_blocks, DType dtype) const {
  return allocate_pools([&](int32_t l) -> Backend& { return layer_backend(l); }, info(), block_size, n_blocks,
                        dtype);
}

Status read_logits(Backend& backend, const Tensor& logits, std::vector<float>& out) {
  out.resize(static_cast<size_t>(logits.n_elements()));
  if (!out.empty()) KILN_TRY(backend.download(out.data(), logits, out.size() * sizeof(float)));
  return backend.synchronize();
}

Status read_token_ids(Backend& backend, const Tensor& ids, std::vector<int32_t>& out) {
  out.resize(static_cast<size_t>(ids.n_elements()));
  if (!out.empty()) KILN_TRY(backend.download(out.data(), ids, out.size() * sizeof(int32_t)));
  return backend.synchronize();
}

uint64_t KvBuffers::bytes() const {
  uint64_t total = 0;
  for (const auto& b : storage) total += b->size();
  return total;
}

}  // namespace kiln
