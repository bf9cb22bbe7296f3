// Arena: the scratch memory of one forward step, bump-allocated from backend buffers. A Scope gives back what
// was allocated inside it when it ends, so each layer reuses the memory of the one before: the peak is one
// layer's scratch plus what lives across layers (the residual stream, the step's logits), not the sum over
// layers. Reuse is safe because a backend runs a program's ops in order (ops/program.h): a tensor is
// overwritten only by ops recorded after every op that reads it.
//
// reset() starts the next step; call it only after the last step's outputs were read (the runtime's
// download + synchronize). After the first step of a given size the arena allocates nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "core/tensor.h"

namespace kiln::blocks {

class Arena {
 public:
  // host_of: chunks are that backend's host memory (Backend::allocate_host) instead of `backend`'s own: a
  // host backend's arena whose tensors a GPU also reads and writes (ModelOptions::host_stage).
  explicit Arena(Backend& backend, Backend* host_of = nullptr) : backend_(backend), host_of_(host_of) {}
  // A contiguous tensor of `type` [ne0, ne1, ne2] from the arena (f32 activations, i32 ids).
  Result<Tensor> alloc(DType type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1);
  Result<Tensor> f32(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
    return alloc(DType::f32, ne0, ne1, ne2);
  }
  Result<Tensor> i32(int64_t ne0, int64_t ne1 = 1) { return alloc(DType::i32, ne0, ne1); }
  // Forgets every tensor handed out (keeps the memory; merges chunks into one when there were several).
  void reset();
  // Bytes handed out and not given back, and the most at once since construction (the size of the one chunk
  // the arena settles on).
  size_t used_bytes() const { return total_used_; }
  size_t peak_bytes() const { return peak_; }
  // Changes whenever a chunk is allocated or freed: tensors handed out before a change may lie in memory
  // given back since, so a program recorded then is valid only while this stays the same.
  uint64_t generation() const { return generation_; }

  // Everything allocated while a Scope lives is given back when it ends (scopes nest, last in first out).
  class Scope {
   public:
    explicit Scope(Arena& arena)
        : arena_(arena), chunk_(arena.chunk_), used_(arena.used_), total_(arena.total_used_) {}
    ~Scope() {
      arena_.chunk_ = chunk_;
      arena_.used_ = used_;
      arena_.total_used_ = total_;
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Arena& arena_;
    size_t chunk_, used_, total_;
  };

 private:
  Backend& backend_;
  Backend* host_of_;
  std::vector<std::unique_ptr<Buffer>> chunks_;
  size_t chunk_ = 0;       // the chunk allocations come from
  size_t used_ = 0;        // bytes used in chunks_[chunk_]
  size_t total_used_ = 0;  // bytes handed out and not given back (what one chunk of this size would hold)
  size_t peak_ = 0;        // largest total_used_ seen
  uint64_t generation_ = 0;
};

}  // namespace kiln::blocks
