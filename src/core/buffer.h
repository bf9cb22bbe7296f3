// Buffer: a block of memory a backend allocated (host RAM for the CPU, device memory for a GPU). Freed when its
// owner drops it. Tensors that live in one point back at it (Tensor::buffer), so a backend can tell its own
// memory from host memory it must not hand to a kernel.
#pragma once

#include <cstddef>

namespace kiln {

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;  // bytes
  // Whether the host may read and write data() directly (CPU memory, or mapped/managed device memory).
  virtual bool host_visible() const = 0;
};

}  // namespace kiln
