#include "models/arena.h"

#include <algorithm>

namespace kiln::blocks {

Result<Tensor> Arena::alloc(DType type, int64_t ne0, int64_t ne1, int64_t ne2) {
  const size_t bytes = (static_cast<size_t>(ne0 * ne1 * ne2) * dtype_info(type).type_size + 63) / 64 * 64;
  // The current chunk, else the next one that fits, else a new one of at least what the whole last step
  // needed (so that a steady state has one chunk).
  while (chunk_ < chunks_.size() && used_ + bytes > chunks_[chunk_]->size()) {
    ++chunk_;  // the rest of this chunk stays unused until a scope or reset() rewinds to it
    used_ = 0;
  }
  if (chunk_ == chunks_.size()) {
    const size_t size = std::max({bytes, peak_, size_t{1} << 20});
    Result<std::unique_ptr<Buffer>> got =
        host_of_ != nullptr ? host_of_->allocate_host(size) : backend_.allocate(size);
    if (!got.ok() && got.status().code() == StatusCode::unimplemented) got = backend_.allocate(size);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, std::move(got));
    chunks_.push_back(std::move(buf));
    ++generation_;
    used_ = 0;
  }
  const Tensor t = make_tensor(type, *chunks_[chunk_], used_, ne0, ne1, ne2);
  used_ += bytes;
  total_used_ += bytes;
  peak_ = std::max(peak_, total_used_);
  return t;
}

void Arena::reset() {
  if (chunks_.size() > 1) {  // the next step allocates one chunk of peak_ bytes
    chunks_.clear();
    ++generation_;
  }
  chunk_ = 0;
  used_ = 0;
  total_used_ = 0;
}

}  // namespace kiln::blocks
