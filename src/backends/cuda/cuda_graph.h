// Replaying decode steps as CUDA graphs. A step of a few tokens is ~15 small kernels a layer; launched one by
// one, the host's launch cost and the gaps between kernels bound a small model (1 ms a token and more). A
// program whose ops, operands and parameters are exactly those of the program captured last (the same
// pointers, shapes and scalars: the step metadata changes on the device, not in the program) replays the
// captured graph with one launch; any other is captured anew (and the old graph updated in place when only
// kernel parameters differ, which is cheaper than instantiating).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/program.h"

namespace kiln::cuda {

// Everything about a program that its kernels' launches depend on, as words to compare.
std::vector<uint64_t> program_signature(const Program& program);

// What decides whether an instantiated graph can take another capture's parameters in place: each node of
// the graph in node order (its type; a kernel's cluster size, which an update would not carry over; a
// memset's shape, whose change from a 2-D one an update refuses), then each edge (its ends' indices, its
// ports and type: a programmatic launch's edge is not a plain one). cudaGraphExecUpdate takes only a graph
// of the same topology, so an instantiated graph is updated from a graph of the same shape alone: another
// token count's kernels, or a cuBLAS kernel where one of ours ran, is instantiated anew.
std::vector<uint64_t> graph_shape(cudaGraph_t graph);

}  // namespace kiln::cuda
