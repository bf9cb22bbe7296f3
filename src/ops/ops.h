// The op contracts: what each op computes, its operands' shapes and types, and check(), which validates an
// op's operands before any backend runs it. Shapes are written innermost first, as Tensor stores them. Inputs
// may be non-contiguous views unless a contract says otherwise. The scalar reference of every op is in
// ops/ref/ (the oracle); backends implement the same contracts (backends/backend.h).
//
// Every operand is a Tensor, step metadata included (token ids, positions, KV slots, block tables, expert
// ids: i32 tensors in backend memory), so that a backend that does not share the host's memory can run an op
// without a copy or a synchronisation. check() is O(1): it reads shapes and types, never the data. The values
// of step metadata are validated once per step, where the step is built (models/step.h); values an op
// produces on the device (MoeRoute's ids) are valid by construction.
//
// Activations: an op's floating-point destination is f32, or f16 / bf16 where the contract says "dst: float",
// for a backend whose supports() accepts it; the CPU backend keeps f32.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {
class Collective;  // ops/collective.h
}

namespace kiln::ops {

// What a backend made of a weight when the model loaded (Backend::prepare_weight): a repacked layout, a tiled
// or FP8 copy with its scales. Backend-private; only the backend that made it reads it.
class PreparedWeight {
 public:
  virtual ~PreparedWeight() = default;
  virtual size_t bytes() const = 0;  // the memory it holds (the load line reports it)
};

// A weight operand: the logical tensor (its GGUF type and shape, in memory the backend can read: the mapped
// file for the CPU, a device copy for a GPU) and the backend's prepared form of it, when it made one.
// Converts from a plain Tensor (no prepared form), as tests and activations-as-weights use it.
// input_scale: an FP8 checkpoint's static activation scale for this weight (`input_scale`), > 0; 0 where it
// has none. A backend that rounds x to e4m3 for an f8_e4m3 weight rounds x / input_scale (saturating at 448)
// instead of each token by its own largest value; one that multiplies by f32 x ignores it.
struct Weight {
  Tensor tensor;
  const PreparedWeight* prepared = nullptr;
  float input_scale = 0.0f;
  Weight() = default;
  Weight(const Tensor& t) : tensor(t) {}  // NOLINT(google-explicit-constructor): a plain tensor is a weight
};

// dst[:, i] = table[:, ids[i]] converted to dst's type.   table: any type [n, n_rows]; ids: i32 [n_ids], each
// in [0, n_rows); dst: float [n, n_ids].
struct GetRows {
  Weight table;
  Tensor ids;
  Tensor dst;
};

// dst[j, i] = sum_k w[k, j] * x[k, i].   w: any type [k, n] (rows contiguous); x: f32 [k, m]; dst: float [n,
// m]. How exactly a backend computes the products is its own option, fixed when it is made (Precision).
struct Matmul {
  Weight w;
  Tensor x;
  Tensor dst;
};

// How a backend computes Matmul, MoeMatmul and Attention: a backend option (BackendOptions::precision), the
// same for every op it runs; the reference takes it as an argument (ops/ref), the oracle of both.
enum class Precision : uint8_t {
  precision_exact,  // f32 products (in another summation order than the reference's f64, at most)
  // Faster, lower precision. The CPU rounds each x row of a matmul to the weight type's activation format
  // (activation_type(): q8_0, q8_1 or q8_K blocks, as llama.cpp does), so the products become integer dot
  // products, at ~1e-3 relative error (weight types without one, f32 / f16 / bf16, stay exact), and runs
  // attention tiled. A GPU may use bf16 / f16 tensor cores instead (Backend::fast_tolerance).
  precision_fast,
};

// The block format x is rounded to under Precision::precision_fast for weights of type `w` (the CPU's, and
// the reference's rounded products); f32 when there is none.
DType activation_type(DType w);

// dst[:, r] = x[:, r] / sqrt(mean(x[:, r]^2) + eps) * (w (+1 when add_one))   x: f32 [n, rows]; dst: float
// [n, rows]; w: f32 [n] or none.
struct RmsNorm {
  Tensor x;
  Weight w;  // tensor.data == nullptr: no weight
  float eps = 1e-6f;
  bool add_one = false;  // Gemma stores w - 1
  Tensor dst;
};

// dst[:, r] = (x - mean) / sqrt(var + eps) * w + b    x, dst: f32 [n, rows]; w, b: f32 [n] or none.
struct LayerNorm {
  Tensor x;
  Weight w;
  Weight b;
  float eps = 1e-5f;
  Tensor dst;
};

enum class RopeLayout : uint8_t {
  rope_layout_normal,  // rotates pairs (x[2i], x[2i+1]) (GGUF llama)
  rope_layout_neox,    // rotates pairs (x[i], x[i + n_rot/2]) (NeoX, Qwen, Gemma, HF)
};
// Llama-3's scaling has no case here: its per-pair factors are a rope_freqs tensor (GGUF files carry one;
// models/hf_import.cpp computes it from config.json), applied through Rope::freq_factors.
enum class RopeScaling : uint8_t {
  rope_scaling_none,
  rope_scaling_linear,
  rope_scaling_yarn,
};

// Frequencies of RoPE: theta_i = pos * freq_base^(-2i/n_rot), adjusted by the scaling type.
struct RopeParams {
  int32_t n_rot = 0;  // rotated dims per head (even, <= head_dim); the rest pass through
  RopeLayout layout = RopeLayout::rope_layout_normal;
  float freq_base = 10000.0f;
  RopeScaling scaling = RopeScaling::rope_scaling_none;
  float factor = 1.0f;           // linear / yarn: context extension factor
  int32_t original_context = 0;  // yarn: the pre-extension context length
  float beta_fast = 32.0f;       // yarn
  float beta_slow = 1.0f;        // yarn
  float attn_factor = 1.0f;      // yarn, longrope: extra magnitude scale (mscale) on cos/sin
};

// Rotary position embedding.  x, dst: f32 [head_dim, n_heads, n_tokens] (dst may alias x); positions: i32
// [n_tokens], each >= 0; freq_factors: f32 [n_rot/2] or none: divides each pair's frequency (GGUF rope_freqs,
// Phi-3's long/short factors).
struct Rope {
  Tensor x;
  Tensor positions;
  RopeParams p;
  Weight freq_factors;
  Tensor dst;
};

// dst[:, r] = softmax(x[:, r] * scale).   x, dst: f32 [n, rows].
struct Softmax {
  Tensor x;
  float scale = 1.0f;
  Tensor dst;
};

// Writes the K and V rows of new tokens into the paged pools.
// k, v: f32 [head_dim, n_kv_heads, n_tokens]; k_pool, v_pool: f32 or f16 [head_dim, n_kv_heads, block_size,
// n_blocks]; slots: i32 [n_tokens], each < n_blocks * block_size (vLLM's slot_mapping): token t goes to block
// slots[t] / block_size, offset slots[t] % block_size.
struct KvWrite {
  Tensor k, v;
  Tensor k_pool, v_pool;
  Tensor slots;
};

// Causal attention over paged K/V: token t (of sequence seq[t], at position pos[t]) attends to positions
// 0..pos[t] of its sequence, read from the pools through that sequence's block table (position p is in block
// table[p / block_size], offset p % block_size). Query head h uses KV head h / (n_heads / n_kv_heads) (GQA).
// q: f32 [head_dim, n_heads, n_tokens]; pools as in KvWrite; dst: f32 [head_dim, n_heads, n_tokens].
// positions, seq: i32 [n_tokens]. The block tables are flattened (CSR, as FlashInfer's paged layout):
// sequence s's table is bt_indices[bt_indptr[s] .. bt_indptr[s + 1]); bt_indptr: i32 [n_seqs + 1],
// bt_indices: i32 [total blocks], each a block of the pools or kFreedBlock. scores = q.k * scale (then
// softcap * tanh(scores / softcap) when softcap > 0); window > 0 keeps only the last `window` positions
// (sliding-window attention). Table entries below every token's window may be kFreedBlock. Under
// Precision::precision_fast a backend may compute q.k and p.v at lower precision (a GPU: f16 tensor cores
// with f32 sums, within Backend::fast_tolerance of the exact result), or in another order (the CPU: a tiled
// online softmax in f32, held to the reference as the exact path is). A block-table entry whose block was
// given back (sliding window: no token of the batch reaches it).
inline constexpr int32_t kFreedBlock = -1;
struct Attention {
  Tensor q;
  Tensor k_pool, v_pool;
  Tensor positions;
  Tensor seq;
  Tensor bt_indptr, bt_indices;
  float scale = 1.0f;
  float softcap = 0.0f;
  int32_t window = 0;
  Tensor dst;
};

enum class GluKind : uint8_t { glu_kind_silu, glu_kind_gelu_tanh, glu_kind_sigmoid };
// dst = act(gate) * up.   up: f32 [n, rows]; dst: float [n, rows]; gate: f32 [n, rows], or [1, rows]: one
// gate per row, broadcast over it (dst[:, r] = act(gate[0, r]) * up[:, r], e.g. a shared expert's sigmoid
// gate).
struct GatedAct {
  Tensor gate, up;
  GluKind kind = GluKind::glu_kind_silu;
  Tensor dst;
};

enum class BinaryKind : uint8_t { binary_kind_add, binary_kind_mul };
// dst = a (+|*) b, b broadcast over rows when it has one row.   a: f32 [n, rows]; dst: float [n, rows]; b:
// f32 [n, rows] or [n, 1] (a bias: a weight).
struct Binary {
  Tensor a;
  Weight b;
  BinaryKind kind = BinaryKind::binary_kind_add;
  Tensor dst;
};

// dst = x * scale.   x, dst: f32 [n, rows].
struct Scale {
  Tensor x;
  float scale = 1.0f;
  Tensor dst;
};

// out[r] = the index of the largest x[:, r] (the first on ties), or -1 when x[:, r] holds a NaN or +inf or
// nothing above -inf (no token a sampler could take).   x: f32 [n, rows]; out: i32 [rows].
struct Argmax {
  Tensor x;
  Tensor out;
};

// One token drawn per row of logits under the row's own sampling parameters (ops/sample.h: the stages, the
// counter-based draw, the reference). x: f32 [n_vocab, rows] (a view may narrow n_vocab); rows: i32 [16,
// rows], a SampleRow each; adjust: i32 [4, n_adjust], a SampleAdjust each (n_adjust may be 0), every row's
// range inside it; out: i32 [2 + 2 * n_top_max, rows]: the token (or a kSample* error code), its logprob
// (f32 bits), then n_top_max (id, logprob f32 bits) pairs, of which the row's n_top are written (n_top <=
// n_top_max); mask: none (no data or no elements), or i32 [ceil(n_vocab / 32), n_mask_rows], rows contiguous,
// u32 bitmasks of the allowed tokens (bit id % 32 of word id / 32), row SampleRow::mask_row of it for a row
// that names one. The values of rows and adjust are checked where they are built (runtime), not here.
struct Sample {
  Tensor x;
  Tensor rows;
  Tensor adjust;
  Tensor out;
  Tensor mask;
};

// Mixture-of-experts routing: per token t, p = softmax(logits[:, t]); the n_used experts of largest p
// (ranked by logit, which orders them the same; ties: the lower expert index first) go to ids[s + n_used * t]
// in descending order, s = 0..n_used-1, and weights[s, t] = p[ids[s + n_used * t]], divided by the sum of the
// n_used chosen p when `normalize`.   logits: f32 [n_expert, n_tokens]; ids: i32 [n_used, n_tokens]; weights:
// f32 [n_used, n_tokens] (n_used = weights.ne[0], 1 <= n_used <= n_expert).
struct MoeRoute {
  Tensor logits;
  Tensor ids;
  Tensor weights;
  bool normalize = false;
};

// Matmul with one expert's matrix per (slot, token): dst[j, s, t] = sum_k w[k, j, e] * x[k, s or 0, t] with
// e = ids[s + n_used * t].   w: any Matmul weight type [k, n, n_expert], expert e the slab e (rows
// contiguous); x: f32 [k, n_x, n_tokens], n_x = 1 (every slot reads the token's one row) or n_used; dst: f32
// [n, n_used, n_tokens]; ids: i32 [n_used, n_tokens], each in [0, n_expert). Precision as in Matmul.
struct MoeMatmul {
  Weight w;
  Tensor x;
  Tensor ids;
  Tensor dst;
};

// dst[:, t] = sum over s = 0..n_slots-1 (in that order) of w[s, t] * y[:, s, t] (the experts' outputs mixed
// by their routing weights).   y: f32 [n, n_slots, n_tokens]; w: f32 [n_slots, n_tokens];
// dst: f32 [n, n_tokens], not overlapping y.
struct WeightedSum {
  Tensor y;
  Tensor w;
  Tensor dst;
};

// Accumulates the statistics of an importance matrix (quant/imatrix_collector.h): the sum over rows of each
// column's square, per matrix of the weight that x multiplies. sums[i, m] += x[i, r]^2 for every row r that
// goes to matrix m, and counts[0, m] += the number of those rows.   x: f32 [n, n_x, n_tokens, n_3]; sums: f32
// [n, n_mat] (rows contiguous); counts: f32 [1, n_mat]; sums and counts do not overlap x or each other. ids
// none: every row of x goes to matrix 0 (n_mat = 1; a Matmul's x). ids: i32 [n_used, n_tokens] (a
// MoeMatmul's, n_3 = 1, n_x = 1 or n_used): slot s of token t reads x[:, n_x == 1 ? 0 : s, t] and goes to
// matrix ids[s + n_used * t], each in [0, n_mat). Accumulates in f32 (counts are exact up to 2^24).
//   gram (data == nullptr: none; ids none only): f32 [n, n], gram[i + n * j] += x[i, r] * x[j, r] for every
// row r (the inputs' Gram matrix X^T X, which GPTQ rounds with: quant/gptq.h); it overlaps nothing else.
//   amax (data == nullptr: none): f32 [1, n_mat], amax[0, m] = max(amax[0, m], |x[i, r]|) over every column i
// and row r that goes to matrix m (the input's range, which a static FP8 activation scale is made from:
// quant/fp8_folder.h); it overlaps nothing else. A NaN in x makes it NaN.
struct SumSquares {
  Tensor x;
  Tensor ids;  // data == nullptr: none
  Tensor sums;
  Tensor counts;
  Tensor gram = {};  // data == nullptr: none
  Tensor amax = {};  // data == nullptr: none
};

// The lower Cholesky factor of the inverse of a symmetric matrix, the factor GPTQ rounds with (quant/gptq.h):
// l lower triangular, positive diagonal, with l l^T = (a + lambda I)^-1, computed in f64 from a's lower
// triangle (j <= i, widened to f64, lambda added to the diagonal) and rounded once to f32; zeros above the
// diagonal. status[0] = 0, or 1 when a + lambda I is not numerically positive definite: a Cholesky pivot not
// above 1e-10 of its diagonal entry (in the order the matrix's rows and columns reversed), or an entry of l
// that is not finite; l is then unspecified.   a: f32 [n, n]; l: f32 [n, n]; status: i32 [1]; a, l contiguous
// and apart; lambda finite, >= 0. Not for a model's step: kiln quantize --method gptq runs it.
struct InverseCholesky {
  Tensor a;
  double lambda = 0.0;
  Tensor l;
  Tensor status;
};

// Tensor parallelism's collectives (ops/collective.h): every rank of `group` runs the op, in the same order
// among its collectives, on operands of the same shapes.
// dst = the sum over the ranks of each rank's x, the same bits on every rank (HostGroup adds in rank order,
// NCCL in its own).   x, dst: f32 [n, rows], contiguous; dst may be x.
struct AllReduce {
  Tensor x;
  Tensor dst;
  const Collective* group = nullptr;
};
// dst[:, j] = the ranks' x[:, j] one after another, in rank order.   x: f32 [n, rows]; dst: f32 [n * world,
// rows]; both contiguous, apart.
struct AllGather {
  Tensor x;
  Tensor dst;
  const Collective* group = nullptr;
};

using Op = std::variant<GetRows, Matmul, RmsNorm, LayerNorm, Rope, Softmax, KvWrite, Attention, GatedAct,
                        Binary, Scale, Argmax, Sample, MoeRoute, MoeMatmul, WeightedSum, SumSquares,
                        InverseCholesky, AllReduce, AllGather>;

// "matmul", "rms_norm", ...
std::string_view op_name(const Op& op);

// Validates an op's operands (types, shapes, scalar parameters), in O(1): invalid_argument naming the op and
// the operand. Reads no tensor data.
Status check(const GetRows& op);
Status check(const Matmul& op);
Status check(const RmsNorm& op);
Status check(const LayerNorm& op);
Status check(const Rope& op);
Status check(const Softmax& op);
Status check(const KvWrite& op);
Status check(const Attention& op);
Status check(const GatedAct& op);
Status check(const Binary& op);
Status check(const Scale& op);
Status check(const Argmax& op);
Status check(const Sample& op);
Status check(const MoeRoute& op);
Status check(const MoeMatmul& op);
Status check(const WeightedSum& op);
Status check(const SumSquares& op);
Status check(const InverseCholesky& op);
Status check(const AllReduce& op);
Status check(const AllGather& op);
Status check(const Op& op);

// The angle of a rotated pair: rope_freq() in ops/rope_freq.h, shared by every backend so all agree.
struct RopeFreq {
  float theta_scale;  // multiply the position by this to get the angle
  float mscale;       // cos/sin magnitude (yarn / longrope attn factor), 1 otherwise
};

// The float types an op's destination may have (see the top of this file): f32, f16, bf16.
bool is_float_activation(DType t);
// The destination of an op, when it has one tensor that is its output (null for KvWrite, Argmax, Sample,
// MoeRoute, SumSquares, InverseCholesky).
const Tensor* float_dst(const Op& op);

}  // namespace kiln::ops
