#include "backends/cuda/cuda_graph.h"

#include <bit>
#include <map>

#include "core/overloaded.h"

namespace kiln::cuda {

namespace {

struct Writer {
  std::vector<uint64_t>& out;
  void put(uint64_t v) { out.push_back(v); }
  void put(float v) { out.push_back(std::bit_cast<uint32_t>(v)); }
  void put(double v) { out.push_back(std::bit_cast<uint64_t>(v)); }
  void put(const Tensor& t) {
    put(reinterpret_cast<uint64_t>(t.data));
    put(static_cast<uint64_t>(t.type));
    for (int i = 0; i < 4; ++i) put(static_cast<uint64_t>(t.ne[i])), put(static_cast<uint64_t>(t.nb[i]));
  }
  void put(const ops::Weight& w) {
    put(w.tensor);
    put(reinterpret_cast<uint64_t>(w.prepared));
  }
  template <class... T>
  void all(const T&... v) {
    (put(v), ...);
  }
};

uint64_t u(auto e) { return static_cast<uint64_t>(e); }

}  // namespace

std::vector<uint64_t> program_signature(const Program& program) {
  std::vector<uint64_t> sig;
  Writer w{sig};
  for (const ops::Op& op : program.ops()) {
    w.put(u(op.index()));
    std::visit(Overloaded{
                   [&](const ops::GetRows& o) { w.all(o.table, o.ids, o.dst); },
                   [&](const ops::Matmul& o) { w.all(o.w, o.x, o.dst); },
                   [&](const ops::RmsNorm& o) { w.all(o.x, o.w, o.eps, u(o.add_one), o.dst); },
                   [&](const ops::LayerNorm& o) { w.all(o.x, o.w, o.b, o.eps, o.dst); },
                   [&](const ops::Rope& o) {
                     const ops::RopeParams& p = o.p;
                     w.all(o.x, o.positions, o.freq_factors, o.dst, u(p.n_rot), u(p.layout), p.freq_base,
                           u(p.scaling), p.factor, u(p.original_context), p.beta_fast, p.beta_slow,
                           p.attn_factor);
                   },
                   [&](const ops::Softmax& o) { w.all(o.x, o.scale, o.dst); },
                   [&](const ops::KvWrite& o) { w.all(o.k, o.v, o.k_pool, o.v_pool, o.slots); },
                   [&](const ops::Attention& o) {
                     w.all(o.q, o.k_pool, o.v_pool, o.positions, o.seq, o.bt_indptr, o.bt_indices, o.scale,
                           o.softcap, u(o.window), o.dst);
                   },
                   [&](const ops::GatedAct& o) { w.all(o.gate, o.up, u(o.kind), o.dst); },
                   [&](const ops::Binary& o) { w.all(o.a, o.b, u(o.kind), o.dst); },
                   [&](const ops::Scale& o) { w.all(o.x, o.scale, o.dst); },
                   [&](const ops::Argmax& o) { w.all(o.x, o.out); },
                   [&](const ops::Sample& o) { w.all(o.x, o.rows, o.adjust, o.out, o.mask); },
                   [&](const ops::MoeRoute& o) { w.all(o.logits, o.ids, o.weights, u(o.normalize)); },
                   [&](const ops::MoeMatmul& o) { w.all(o.w, o.x, o.ids, o.dst); },
                   [&](const ops::WeightedSum& o) { w.all(o.y, o.w, o.dst); },
                   [&](const ops::SumSquares& o) { w.all(o.x, o.ids, o.sums, o.counts, o.gram, o.amax); },
                   [&](const ops::InverseCholesky& o) { w.all(o.a, o.lambda, o.l, o.status); },
                   [&](const ops::AllReduce& o) { w.all(o.x, o.dst, reinterpret_cast<uint64_t>(o.group)); },
                   [&](const ops::AllGather& o) { w.all(o.x, o.dst, reinterpret_cast<uint64_t>(o.group)); },
               },
               op);
  }
  return sig;
}

std::vector<uint64_t> graph_shape(cudaGraph_t graph) {
  std::vector<uint64_t> shape;
  size_t n = 0, n_edges = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) return shape;
  std::vector<cudaGraphNode_t> nodes(n);
  if (cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) return shape;
  std::map<cudaGraphNode_t, uint64_t> index;
  for (cudaGraphNode_t node : nodes) {
    index.emplace(node, index.size());
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) type = cudaGraphNodeTypeCount;
    shape.push_back(static_cast<uint64_t>(type));
    if (type == cudaGraphNodeTypeKernel) {
      cudaLaunchAttributeValue v{};
      if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeClusterDimension, &v) != cudaSuccess) {
        v.clusterDim = {0, 0, 0};
      }
      shape.push_back(v.clusterDim.x * v.clusterDim.y * v.clusterDim.z);
    } else if (type == cudaGraphNodeTypeMemset) {
      cudaMemsetParams m{};
      (void)cudaGraphMemsetNodeGetParams(node, &m);
      shape.insert(shape.end(), {m.elementSize, m.width, m.height, m.height > 1 ? m.pitch : 0});
    }
  }
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n_edges) == cudaSuccess) {
    std::vector<cudaGraphNode_t> from(n_edges), to(n_edges);
    std::vector<cudaGraphEdgeData> data(n_edges);
    if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n_edges) == cudaSuccess) {
      for (size_t e = 0; e < n_edges; ++e) {
        shape.push_back(index[from[e]] << 32 | index[to[e]]);
        shape.push_back(uint64_t{data[e].from_port} << 16 | uint64_t{data[e].to_port} << 8 | data[e].type);
      }
    }
  }
  cudaGetLastError();
  return shape;
}

}  // namespace kiln::cuda
