// Tensor parallelism's view of a GGUF file for one rank (models/tp_plan.h's partition): the same architecture
// with fewer heads and FFN features, each weight being the rank's part of it, so that load_model() makes the
// rank's model as it makes any other. What the rank's model derives from head counts and widths (the head
// size, the attention scale, the RoPE dimensions, the experts' widths) is written into the view explicitly,
// so that it computes on its heads exactly what the whole model computes on them.
//
// The view's tensors point into the whole file where the rank's part is contiguous in it (replicated
// weights, the token embedding, row ranges of a matrix: Q/K/V, gate/up, the output head); the others
// (column splits: the output projection, down; every expert's rows; Phi-3's fused Q/K/V and gate+up) are
// copies that the view owns.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "formats/gguf.h"
#include "models/tp_plan.h"

namespace kiln::tp {

// The partition's shape from the file's {arch}.* metadata: attention.head_count, head_count_kv (default
// head_count), key_length (default as the model reads it: embedding_length / head_count, Gemma 3's 256),
// feed_forward_length (0 when absent), expert_count, expert_feed_forward_length (default
// feed_forward_length), and the vocabulary from token_embd.weight's rows. Errors: unimplemented for a
// per-layer array of those (naming the key); the metadata's own errors (named).
Result<Shape> shape_of(const gguf::File& file);

// Rank `rank`'s view of `whole` over `world` ranks; it keeps `whole` alive. Metadata: every key of the file,
// with {arch}.attention.head_count / head_count_kv the rank's heads, key_length / value_length the head size,
// attention.scale and rope.dimension_count the whole model's, feed_forward_length,
// expert_feed_forward_length and expert_shared_feed_forward_length the rank's features (the last two when
// the model has experts), and general.name the file's name when it has none. Tensors: Plan::part() of each;
// a file without output.weight (a tied head) gets one, the rank's rows of token_embd.weight. Errors: a
// world or rank out of range; Plan::make()'s and Plan::part()'s (naming the count or the weight); a shared
// expert's width that the world does not divide.
Result<std::shared_ptr<const gguf::File>> shard_file(std::shared_ptr<const gguf::File> whole, int32_t world,
                                                     int32_t rank);

}  // namespace kiln::tp
