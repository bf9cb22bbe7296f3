// A model split over the ranks of a tensor-parallel group (Megatron's partition: models/tp_plan.h). Rank r's
// model is load_model() of its view of the file (models/tp_shard.h) on backends[r], recording its steps with
// the group's rank r (ModelOptions::collective). A step runs every rank's forward at once, rank 0's on the
// caller's thread and each other rank's on a thread of its own, and returns rank 0's logits, which its output
// head gathered from every rank's part of the vocabulary.
//
// One process with a thread a rank, rather than a process a GPU: the ranks share the engine (scheduler,
// tokenizer, sampler) and the step's one batch, so nothing crosses between them but the collectives' data,
// which NCCL moves between the GPUs directly; there is no second copy of the engine's state to keep in step.
#pragma once

#include <memory>
#include <span>

#include "models/model.h"
#include "ops/collective.h"

namespace kiln {

// backends[r] runs rank r (backends.size() == group.world()); the file and the group must outlive the model.
// Errors: a partition that does not divide the model (tp::Plan's, naming the count), options with `rest`
// (partial offload), and each rank's load errors.
Result<std::unique_ptr<Model>> load_tp_model(std::shared_ptr<const gguf::File> file,
                                             std::span<Backend* const> backends, CollectiveGroup& group,
                                             const ModelOptions& options);

}  // namespace kiln
