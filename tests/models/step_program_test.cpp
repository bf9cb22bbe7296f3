// One forward step as the backend sees it. A recording backend (the CPU backend underneath) keeps every
// program it runs and the buffers it allocated; on the default model (SmolLM2-135M) and Gemma 3 it shows:
// - the program of a decode step and of a mixed prefill + decode step, op by op;
// - that no op holds a host pointer to step data: every i32 operand (ids, positions, slots, block tables,
//   logit rows) and every activation lies in a buffer the backend allocated, weights in the mapped file;
// - that the logits equal those of the plain CPU backend, and the backend ran exactly one program per step;
// - the scratch peak of a step, against the arena's per-layer formula.
// Also: check_batch refuses every value an op would read out of range, naming it; padded decode rows
// (pad_decode) change nothing the real rows get.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/overloaded.h"
#include "formats/gguf.h"
#include "models/model.h"
#include "ops/ops.h"
#include "runtime/placement/offload.h"  // the host stage of a split model, as the engine gives it

namespace kiln {
namespace {

std::string model_path(const char* file) {
  const char* dir = std::getenv("KILN_MODELS_DIR");
  const std::string d =
      dir != nullptr && *dir != '\0' ? dir : std::string(std::getenv("HOME")) + "/.cache/kiln/models";
  return d + "/" + file;
}

// Forwards everything to a CPU backend and records the programs and the buffers.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend() : cpu_(make_backend("cpu", BackendOptions{2}).value()) {}
  std::string_view name() const override { return "recording"; }
  bool host_memory() const override { return device_free == 0; }  // a device when it says it has memory
  bool supports(const ops::Op& op) const override { return cpu_->supports(op); }
  Status run(const Program& program) override {
    programs.push_back(program.ops());
    versions.push_back(program.version());
    return cpu_->run(program);
  }
  Result<std::unique_ptr<Buffer>> allocate(size_t bytes) override {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, cpu_->allocate(bytes));
    buffers.insert(b.get());
    return b;
  }
  Result<std::unique_ptr<Buffer>> allocate_host(size_t bytes) override {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, cpu_->allocate_host(bytes));
    buffers.insert(b.get());
    return b;
  }
  Status upload(const Tensor& dst, const void* src, size_t bytes) override {
    ++uploads;
    return cpu_->upload(dst, src, bytes);
  }
  Status download(void* dst, const Tensor& src, size_t bytes) override {
    return cpu_->download(dst, src, bytes);
  }
  Status copy(const Tensor& dst, const Tensor& src) override { return cpu_->copy(dst, src); }
  Status synchronize() override { return cpu_->synchronize(); }
  uint64_t device_memory_free() const override { return device_free; }
  Result<std::unique_ptr<WeightHandle>> prepare_weight(const Tensor& logical, std::string_view name,
                                                       WeightRole role) override {
    prepared.emplace(name);
    return cpu_->prepare_weight(logical, name, role);
  }

  std::vector<std::vector<ops::Op>> programs;
  std::vector<uint64_t> versions;   // Program::version() of each program run
  std::set<const Buffer*> buffers;  // every buffer ever allocated (a freed one stays: addresses only)
  std::set<std::string> prepared;   // the names of the weights it prepared
  int uploads = 0;
  uint64_t device_free = 0;  // > 0: it says it is a device (its memory is not the host's)

 private:
  std::unique_ptr<Backend> cpu_;
};

// Every tensor operand of an op: (name, tensor, is_weight).
struct Operand {
  std::string name;
  Tensor t;
  bool weight;
};
std::vector<Operand> operands(const ops::Op& op) {
  using namespace kiln::ops;
  auto w = [](std::string n, const Weight& x) { return Operand{std::move(n), x.tensor, true}; };
  auto a = [](std::string n, const Tensor& x) { return Operand{std::move(n), x, false}; };
  return std::visit(
      Overloaded{
          [&](const GetRows& o) -> std::vector<Operand> {
            // The logits' row gather reads the residual stream: an activation passed as the table.
            return {Operand{"table", o.table.tensor, o.table.tensor.buffer == nullptr}, a("ids", o.ids),
                    a("dst", o.dst)};
          },
          [&](const Matmul& o) -> std::vector<Operand> {
            return {w("w", o.w), a("x", o.x), a("dst", o.dst)};
          },
          [&](const RmsNorm& o) -> std::vector<Operand> {
            return {a("x", o.x), w("w", o.w), a("dst", o.dst)};
          },
          [&](const LayerNorm& o) -> std::vector<Operand> {
            return {a("x", o.x), w("w", o.w), w("b", o.b), a("dst", o.dst)};
          },
          [&](const Rope& o) -> std::vector<Operand> {
            return {a("x", o.x), a("positions", o.positions), w("freq_factors", o.freq_factors),
                    a("dst", o.dst)};
          },
          [&](const Softmax& o) -> std::vector<Operand> {
            return {a("x", o.x), a("dst", o.dst)};
          },
          [&](const KvWrite& o) -> std::vector<Operand> {
            return {a("k", o.k), a("v", o.v), a("k_pool", o.k_pool), a("v_pool", o.v_pool),
                    a("slots", o.slots)};
          },
          [&](const Attention& o) -> std::vector<Operand> {
            return {a("q", o.q),
                    a("k_pool", o.k_pool),
                    a("v_pool", o.v_pool),
                    a("positions", o.positions),
                    a("seq", o.seq),
                    a("bt_indptr", o.bt_indptr),
                    a("bt_indices", o.bt_indices),
                    a("dst", o.dst)};
          },
          [&](const GatedAct& o) -> std::vector<Operand> {
            return {a("gate", o.gate), a("up", o.up), a("dst", o.dst)};
          },
          [&](const Binary& o) -> std::vector<Operand> {
            return {a("a", o.a), Operand{"b", o.b.tensor, o.b.tensor.buffer == nullptr}, a("dst", o.dst)};
          },
          [&](const Scale& o) -> std::vector<Operand> {
            return {a("x", o.x), a("dst", o.dst)};
          },
          [&](const Argmax& o) -> std::vector<Operand> {
            return {a("x", o.x), a("out", o.out)};
          },
          [&](const Sample& o) -> std::vector<Operand> {
            return {a("x", o.x), a("rows", o.rows), a("adjust", o.adjust), a("out", o.out)};
          },
          [&](const MoeRoute& o) -> std::vector<Operand> {
            return {a("logits", o.logits), a("ids", o.ids), a("weights", o.weights)};
          },
          [&](const MoeMatmul& o) -> std::vector<Operand> {
            return {w("w", o.w), a("x", o.x), a("ids", o.ids), a("dst", o.dst)};
          },
          [&](const WeightedSum& o) -> std::vector<Operand> {
            return {a("y", o.y), a("w", o.w), a("dst", o.dst)};
          },
          [&](const SumSquares& o) -> std::vector<Operand> {
            std::vector<Operand> v{a("x", o.x), a("sums", o.sums), a("counts", o.counts)};
            if (o.ids.data != nullptr) v.push_back(a("ids", o.ids));
            return v;
          },
          [&](const InverseCholesky& o) -> std::vector<Operand> {
            return {a("a", o.a), a("l", o.l), a("status", o.status)};
          },
          [&](const AllReduce& o) -> std::vector<Operand> {
            return {a("x", o.x), a("dst", o.dst)};
          },
          [&](const AllGather& o) -> std::vector<Operand> {
            return {a("x", o.x), a("dst", o.dst)};
          },
      },
      op);
}

// Whether [p, p + bytes) lies inside one of `buffers`.
bool inside(const std::set<const Buffer*>& buffers, const Tensor& t) {
  if (t.buffer == nullptr || !buffers.contains(t.buffer)) return false;
  auto* b = const_cast<Buffer*>(t.buffer);
  const auto* lo = static_cast<const uint8_t*>(b->data());
  const auto* p = static_cast<const uint8_t*>(t.data);
  return p >= lo && p <= lo + b->size();
}

struct Loaded {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<OffloadRunner> host_stage;  // split: the engine's runner, with its defaults
  std::unique_ptr<Model> model;
  std::unique_ptr<KvBuffers> kv;
};
Loaded load(Backend& backend, const char* file_name, Backend* rest = nullptr, int32_t n_first_layers = 0,
            bool reuse_program = true) {
  Loaded l;
  auto f = gguf::File::open(model_path(file_name));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return l;
  l.file = std::make_shared<const gguf::File>(std::move(f).value());
  ModelOptions options;
  options.n_ctx = 256;
  options.rest = rest;
  options.n_first_layers = n_first_layers;
  options.reuse_program = reuse_program;
  if (rest != nullptr) {
    l.host_stage = std::make_unique<OffloadRunner>(OffloadOptions{});
    options.host_stage = l.host_stage.get();
  }
  auto m = load_model(l.file, backend, options);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return l;
  l.model = std::move(m).value();
  auto kv = KvBuffers::allocate(*l.model, 16, 16, DType::f32);
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  l.kv = std::make_unique<KvBuffers>(std::move(kv).value());
  return l;
}

// Sequence 0: 20 positions in blocks {3, 7}; sequence 1: 5 positions in block {9}.
const std::vector<int32_t> kTable0 = {3, 7}, kTable1 = {9};

// Prefill both sequences' first tokens (positions 0..n-1), the setup of the decode step below.
Batch prefill(int32_t n0, int32_t n1) {
  Batch b;
  b.block_tables = {kTable0, kTable1};
  for (int32_t i = 0; i < n0; ++i) b.tokens.push_back(100 + i), b.positions.push_back(i), b.seq.push_back(0);
  for (int32_t i = 0; i < n1; ++i) b.tokens.push_back(200 + i), b.positions.push_back(i), b.seq.push_back(1);
  b.logit_rows = {n0 - 1, n0 + n1 - 1};
  return b;
}

Batch decode() {  // one token of each sequence
  Batch b;
  b.block_tables = {kTable0, kTable1};
  b.tokens = {300, 301};
  b.positions = {19, 4};
  b.seq = {0, 1};
  b.logit_rows = {0, 1};
  return b;
}

Batch decode_at(int32_t p0, int32_t p1) {  // decode(), further on in the same blocks
  Batch b = decode();
  b.tokens = {303 + p0, 304 + p1};
  b.positions = {p0, p1};
  return b;
}

Batch mixed() {  // a prefill chunk of sequence 1 (positions 5..9), then sequence 0's decode token
  Batch b;
  b.block_tables = {kTable0, kTable1};
  for (int32_t i = 5; i < 10; ++i) b.tokens.push_back(400 + i), b.positions.push_back(i), b.seq.push_back(1);
  b.tokens.push_back(302), b.positions.push_back(20), b.seq.push_back(0);
  b.logit_rows = {4, 5};
  return b;
}

std::vector<std::string> names(const std::vector<ops::Op>& program) {
  std::vector<std::string> out;
  for (const ops::Op& op : program) out.emplace_back(ops::op_name(op));
  return out;
}

void check_operands(const RecordingBackend& rec, const std::vector<ops::Op>& program);

// Runs the step on the recording backend, checks its program's operands, returns the logits.
std::vector<float> step(RecordingBackend& rec, Loaded& l, const Batch& batch) {
  const size_t before = rec.programs.size();
  const int uploads_before = rec.uploads;
  Result<Tensor> logits = l.model->forward(batch, *l.kv);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  std::vector<float> host;
  if (!logits.ok()) return host;
  EXPECT_TRUE(read_logits(rec, *logits, host).ok());
  EXPECT_EQ(rec.programs.size(), before + 1) << "one program per step";
  EXPECT_EQ(rec.uploads, uploads_before + 1) << "the step's metadata goes up in one transfer";
  check_operands(rec, rec.programs.back());
  return host;
}

// Every operand of `program` lies in memory `rec` allocated, every weight in the mapped file.
void check_operands(const RecordingBackend& rec, const std::vector<ops::Op>& program) {
  for (size_t i = 0; i < program.size(); ++i) {
    for (const Operand& o : operands(program[i])) {
      if (o.t.data == nullptr) continue;  // an absent optional operand
      if (o.weight) {
        EXPECT_EQ(o.t.buffer, nullptr) << i << " " << ops::op_name(program[i]) << " " << o.name;
        continue;
      }
      EXPECT_TRUE(inside(rec.buffers, o.t))
          << "op " << i << " " << ops::op_name(program[i]) << ": operand " << o.name << " " << o.t.describe()
          << " is not in memory the backend allocated";
    }
  }
}

TEST(StepProgram, DecodeAndMixedStepsOnTheDefaultModel) {
  RecordingBackend rec;
  Loaded l = load(rec, "SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_TRUE(l.model);
  const int32_t n_layers = l.model->info().n_layers;
  step(rec, l, prefill(19, 4));
  const std::vector<float> dec = step(rec, l, decode());
  const std::vector<std::string> decode_ops = names(rec.programs.back());

  // The program: embedding gather, 16 ops per layer, then the logit rows' gather, the final norm, the head.
  const std::vector<std::string> layer = {"rms_norm", "matmul",    "matmul", "matmul", "rope",     "rope",
                                          "kv_write", "attention", "matmul", "binary", "rms_norm", "matmul",
                                          "matmul",   "gated_act", "matmul", "binary"};
  std::vector<std::string> want = {"get_rows"};
  for (int32_t i = 0; i < n_layers; ++i) want.insert(want.end(), layer.begin(), layer.end());
  want.insert(want.end(), {"get_rows", "rms_norm", "matmul"});
  EXPECT_EQ(decode_ops, want);
  // Its first layer, printed as the record of what one decode step runs.
  std::string shown;
  for (size_t i = 0; i < 1 + layer.size(); ++i) shown += decode_ops[i] + " ";
  fmt::print("decode step: {} ops; the embedding and layer 0: {}...\n", decode_ops.size(), shown);

  // The mixed step runs the same ops on 6 tokens of two sequences (the KV of the prefill chunk and of the
  // decode token written, attention reading each sequence's own blocks).
  const std::vector<float> mix = step(rec, l, mixed());
  EXPECT_EQ(names(rec.programs.back()), want);
  const auto& att = std::get<ops::Attention>(rec.programs.back()[8]);
  EXPECT_EQ(att.q.ne[2], 6);
  EXPECT_EQ(att.bt_indptr.ne[0], 3);
  EXPECT_EQ(att.bt_indices.span_as<const int32_t>()[2], 9);

  // The same steps on the plain CPU backend give the same logits, bit for bit.
  std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{2}).value();
  Loaded plain = load(*cpu, "SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_TRUE(plain.model);
  std::vector<float> want_dec, want_mix;
  for (const auto& [batch, out] : {std::pair{prefill(19, 4), (std::vector<float>*)nullptr},
                                   std::pair{decode(), &want_dec}, std::pair{mixed(), &want_mix}}) {
    Result<Tensor> lg = plain.model->forward(batch, *plain.kv);
    ASSERT_TRUE(lg.ok());
    std::vector<float> host;
    ASSERT_TRUE(read_logits(*cpu, *lg, host).ok());
    if (out != nullptr) *out = host;
  }
  EXPECT_EQ(dec, want_dec);
  EXPECT_EQ(mix, want_mix);

  // The weights as the backend prepared them: named, with their roles, Q/K/V and gate/up whole.
  const auto handles = l.model->weights();
  ASSERT_FALSE(handles.empty());
  EXPECT_EQ(handles.front()->name, "token_embd.weight");
  // SmolLM2 has no output.weight: the embedding table is also the output head.
  EXPECT_EQ(handles.front()->role, WeightRole::weight_role_tied_embedding);
}

// A step whose metadata has the shapes and places of a step recorded before, over the same KV pools, runs the
// program recorded for that step again (Program::version() unchanged: a backend keeps what it made of it),
// also after steps of other shapes between them (a decode step after a prompt chunk's), with the logits of a
// model that records every step (ModelOptions::reuse_program false); any other step records anew.
TEST(StepProgram, AStepShapedAsOneBeforeRunsItsProgramAgain) {
  RecordingBackend rec, fresh;
  Loaded l = load(rec, "SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_TRUE(l.model);
  Loaded plain = load(fresh, "SmolLM2-135M-Instruct.Q4_1.gguf", nullptr, 0, /*reuse_program=*/false);
  ASSERT_TRUE(plain.model);
  KvBuffers other = KvBuffers::allocate(*l.model, 16, 16, DType::f32).value();
  const std::vector<Batch> steps = {
      prefill(19, 4),    decode(),          decode_at(20, 5),  decode_at(21, 6),  mixed(),
      decode_at(22, 10), decode_at(23, 11), decode_at(24, 12), decode_at(25, 13), mixed()};
  // The step whose program step i runs again (-1: recorded anew); steps 5 and 6 decode over other KV pools,
  // step 7 over the first ones again.
  const std::vector<int> again = {-1, -1, 1, 1, -1, -1, 5, 1, 1, 4};
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(i);
    // The same cache contents in other pools (the program must name them), and back.
    if (i == 5 || i == 7) {
      KvBuffers& from = i == 5 ? *l.kv : other;
      KvBuffers& to = i == 5 ? other : *l.kv;
      for (size_t j = 0; j < l.kv->k.size(); ++j) {
        ASSERT_TRUE(rec.copy(to.k[j], from.k[j]).ok());
        ASSERT_TRUE(rec.copy(to.v[j], from.v[j]).ok());
      }
    }
    KvBuffers& kv = i == 5 || i == 6 ? other : *l.kv;
    Result<Tensor> lg = l.model->forward(steps[i], kv);
    ASSERT_TRUE(lg.ok()) << lg.status().to_string();
    std::vector<float> got, want;
    ASSERT_TRUE(read_logits(rec, *lg, got).ok());
    Result<Tensor> plg = plain.model->forward(steps[i], *plain.kv);
    ASSERT_TRUE(plg.ok());
    ASSERT_TRUE(read_logits(fresh, *plg, want).ok());
    EXPECT_EQ(got, want);
    ASSERT_EQ(rec.versions.size(), i + 1);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_EQ(rec.versions[i] == rec.versions[j],
                again[i] >= 0 && rec.versions[j] == rec.versions[again[i]])
          << "against step " << j;
      EXPECT_NE(fresh.versions[i], fresh.versions[j]);  // recorded every step
    }
    check_operands(rec, rec.programs.back());
  }
}

// The scratch of a step: the residual stream and the logits live across layers, each layer's scratch is
// given back at its end (arena scopes). All sizes 64-byte rounded, as the arena hands them out.
size_t rounded(int64_t bytes) { return static_cast<size_t>((bytes + 63) / 64 * 64); }
struct Scratch {
  size_t x, norm, attention, attention_out, ffn, logits;
};
Scratch scratch(const ModelInfo& info, int64_t n_heads, int64_t n_ff, int64_t n, int64_t n_logits) {
  const int64_t f = sizeof(float), e = info.n_embd, hd = info.head_dim;
  const int64_t q = n_heads * hd, kvd = int64_t{info.n_kv_heads} * hd;
  Scratch s;
  s.x = s.norm = s.attention_out = rounded(e * n * f);
  s.attention = s.attention_out + 2 * rounded(q * n * f) + 2 * rounded(kvd * n * f);  // out, q, k, v, a
  s.ffn = rounded(e * n * f) + 2 * rounded(n_ff * n * f);                             // out, gate, up
  s.logits = n_logits == 0 ? 0 : rounded(info.n_vocab * n_logits * f) + 2 * rounded(e * n_logits * f);
  return s;
}
// With scopes: the residual stream + the largest of one layer (its first norm + attention, or + attention's
// output + the second norm + the FFN) and the logits.
size_t peak_scoped(const Scratch& s) {
  const size_t layer = s.norm + std::max(s.attention, s.attention_out + s.norm + s.ffn);
  return s.x + std::max(layer, s.logits);
}
// Without (one bump allocation over the step): every layer's scratch added up.
size_t peak_unscoped(const Scratch& s, int32_t n_layers) {
  return s.x + n_layers * (2 * s.norm + s.attention + s.ffn) + s.logits;
}

// Partial offload: the embedding and the first n layers on one backend, the later layers and the head on a
// second. Each backend runs one program a step holding its own layers' ops, on operands in its own memory;
// each layer's weights and K/V live on its backend (a tied head's table is copied to the second); the logits
// are those of the model on one backend, bit for bit.
TEST(StepProgram, ASplitModelGivesTheLogitsOfOneBackend) {
  for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
    SCOPED_TRACE(file);
    RecordingBackend one;
    Loaded plain = load(one, file);
    ASSERT_TRUE(plain.model);
    const int32_t n_layers = plain.model->info().n_layers;
    const std::vector<Batch> batches = {prefill(19, 4), decode(), mixed()};
    std::vector<std::vector<float>> want;
    for (const Batch& b : batches) want.push_back(step(one, plain, b));
    for (const int32_t n_first : {0, 1, n_layers / 2, n_layers - 1, n_layers}) {
      SCOPED_TRACE(fmt::format("first {} of {} layers", n_first, n_layers));
      RecordingBackend first, rest;
      Loaded l = load(first, file, &rest, n_first);
      ASSERT_TRUE(l.model);
      const bool split = n_first < n_layers;
      Backend& last = split ? static_cast<Backend&>(rest) : first;
      EXPECT_EQ(&l.model->output_backend(), &last);
      for (int32_t layer = 0; layer < n_layers; ++layer) {
        RecordingBackend& home = layer < n_first || !split ? first : rest;
        EXPECT_EQ(&l.model->layer_backend(layer), &home) << layer;
        EXPECT_TRUE(inside(home.buffers, l.kv->k[layer]) && inside(home.buffers, l.kv->v[layer])) << layer;
        const std::string q = fmt::format("blk.{}.attn_q.weight", layer);
        EXPECT_TRUE(home.prepared.contains(q)) << q;
        EXPECT_FALSE((&home == &first ? rest : first).prepared.contains(q)) << q;
      }
      EXPECT_TRUE(first.prepared.contains("token_embd.weight"));
      EXPECT_TRUE(static_cast<RecordingBackend&>(last).prepared.contains("output_norm.weight"));
      EXPECT_EQ(l.model->info().n_params, plain.model->info().n_params) << "a copy is not a parameter";
      for (size_t i = 0; i < batches.size(); ++i) {
        Result<Tensor> lg = l.model->forward(batches[i], *l.kv);
        ASSERT_TRUE(lg.ok()) << lg.status().to_string();
        std::vector<float> got;
        ASSERT_TRUE(read_logits(l.model->output_backend(), *lg, got).ok());
        EXPECT_EQ(got, want[i]) << "batch " << i;
        ASSERT_EQ(first.programs.size(), i + 1);
        ASSERT_EQ(rest.programs.size(), split ? i + 1 : 0);
        auto count = [](const std::vector<ops::Op>& p, std::string_view name) {
          return std::count_if(p.begin(), p.end(),
                               [&](const ops::Op& op) { return ops::op_name(op) == name; });
        };
        EXPECT_EQ(count(first.programs.back(), "kv_write"), split ? n_first : n_layers);
        check_operands(first, first.programs.back());
        if (split) {
          EXPECT_EQ(count(rest.programs.back(), "kv_write"), n_layers - n_first);
          EXPECT_EQ(ops::op_name(rest.programs.back().back()), "matmul") << "the head is the second's";
          check_operands(rest, rest.programs.back());
        }
      }
    }
  }
}

// Split with the first backend a device: a prompt's step runs the second (host) backend's matmuls on the
// device, x uploaded once for Q/K/V and gate/up; decode steps stay on the host. Same bits as one backend here
// (both are CPU kernels underneath).
TEST(StepProgram, APromptsHostMatmulsRunOnTheDevice) {
  const char* file = "SmolLM2-135M-Instruct.Q4_1.gguf";
  Batch prompt;  // 40 tokens of sequence 0
  prompt.block_tables = {kTable0, kTable1};
  for (int32_t i = 0; i < 20; ++i)
    prompt.tokens.push_back(100 + i), prompt.positions.push_back(i), prompt.seq.push_back(0);
  for (int32_t i = 0; i < 16; ++i)
    prompt.tokens.push_back(200 + i), prompt.positions.push_back(i), prompt.seq.push_back(1);
  prompt.logit_rows = {19, 35};
  static const std::vector<int32_t> table1 = {9, 11};
  Batch next = decode();
  next.positions = {20, 16};
  next.block_tables = {kTable0, table1};
  RecordingBackend one;
  Loaded plain = load(one, file);
  ASSERT_TRUE(plain.model);
  const int32_t n_layers = plain.model->info().n_layers, n_first = 10;
  RecordingBackend device, host;
  device.device_free = uint64_t{1} << 30;
  Loaded l = load(device, file, &host, n_first);
  ASSERT_TRUE(l.model);
  for (const Batch* b : {&prompt, &next}) {
    const std::vector<float> want = step(one, plain, *b);
    const size_t device_programs = device.programs.size(), host_programs = host.programs.size();
    Result<Tensor> lg = l.model->forward(*b, *l.kv);
    ASSERT_TRUE(lg.ok()) << lg.status().to_string();
    std::vector<float> got;
    ASSERT_TRUE(read_logits(l.model->output_backend(), *lg, got).ok());
    EXPECT_EQ(got, want);
    // The device's own program, then (the prompt) 4 runs of matmuls a host layer: Q/K/V, o, gate/up, down.
    const bool offloaded = b == &prompt;
    const size_t runs = offloaded ? 4 * static_cast<size_t>(n_layers - n_first) : 0;
    ASSERT_EQ(device.programs.size(), device_programs + 1 + runs);
    for (size_t i = device_programs + 1; i < device.programs.size(); ++i) {
      for (const ops::Op& op : device.programs[i]) {
        ASSERT_EQ(ops::op_name(op), "matmul");
        const auto& m = std::get<ops::Matmul>(op);
        EXPECT_EQ(m.x.ne[1], 36);
        // x and the product in the device's buffers (freed since: their addresses only).
        EXPECT_TRUE(device.buffers.contains(m.x.buffer) && device.buffers.contains(m.dst.buffer));
      }
    }
    if (offloaded) {
      EXPECT_EQ(device.programs[device_programs + 1].size(), 3u) << "Q, K and V";
      EXPECT_EQ(device.programs[device_programs + 3].size(), 2u) << "gate and up";
    }
    size_t host_matmuls = 0;
    for (size_t i = host_programs; i < host.programs.size(); ++i) {
      for (const ops::Op& op : host.programs[i]) host_matmuls += ops::op_name(op) == "matmul";
    }
    EXPECT_EQ(host_matmuls, offloaded ? 1 : 1 + 7 * static_cast<size_t>(n_layers - n_first))
        << "the head stays";
  }
}

TEST(StepProgram, ScratchPeakIsOneLayer) {
  std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{2}).value();
  for (const char* file : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
    Loaded l = load(*cpu, file);
    ASSERT_TRUE(l.model);
    Batch b;  // two sequences of 16 tokens
    b.block_tables = {kTable0, kTable1};
    for (int32_t i = 0; i < 32; ++i)
      b.tokens.push_back(i), b.positions.push_back(i % 16), b.seq.push_back(i / 16);
    b.logit_rows = {15, 31};
    ASSERT_TRUE(l.model->forward(b, *l.kv).ok());
    const ModelInfo& info = l.model->info();
    const std::string& a = info.architecture;
    const int64_t n_heads = l.file->get_uint(a + ".attention.head_count").value();
    const int64_t n_ff = l.file->get_uint(a + ".feed_forward_length").value();
    const Scratch s = scratch(info, n_heads, n_ff, 32, 2);
    EXPECT_EQ(l.model->peak_scratch_bytes(), peak_scoped(s)) << file;
    fmt::print("scratch of a 32-token step, {}: {:.2f} MiB with per-layer scopes, {:.2f} MiB without\n", file,
               peak_scoped(s) / 1048576.0, peak_unscoped(s, info.n_layers) / 1048576.0);
  }
  // The same formula for a Llama-3-8B-shaped model (n_embd 4096, 32 heads / 8 KV heads of 128, n_ff 14336,
  // 32 layers, 128,256 tokens) at a 512-token prefill step with one logit row.
  ModelInfo l8;
  l8.n_embd = 4096, l8.head_dim = 128, l8.n_kv_heads = 8, l8.n_vocab = 128256, l8.n_layers = 32;
  const Scratch big = scratch(l8, 32, 14336, 512, 1);
  fmt::print(
      "scratch of a 512-token step, Llama-3-8B shapes: {:.1f} MiB with per-layer scopes, {:.1f} MiB "
      "without\n",
      peak_scoped(big) / 1048576.0, peak_unscoped(big, l8.n_layers) / 1048576.0);
  EXPECT_LT(peak_scoped(big) * 10, peak_unscoped(big, l8.n_layers));
}

// A decode step padded to more rows (pad_decode, as the engine pads for a backend that replays recorded
// steps) gives its real rows the tokens of the unpadded step, greedy and sampled, and writes no K/V but the
// spare block's: the real blocks hold the same bytes as after the unpadded step.
TEST(StepProgram, PaddedDecodeRowsChangeNothing) {
  std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{2}).value();
  Loaded plain = load(*cpu, "SmolLM2-135M-Instruct.Q4_1.gguf");
  Loaded padded = load(*cpu, "SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_TRUE(plain.model && padded.model);
  const int32_t n_vocab = plain.model->info().n_vocab;
  const std::vector<int32_t> spare = {15};  // kTable0 and kTable1 use blocks 3, 7 and 9 of 16
  auto run = [&](Loaded& l, const Batch& b) {
    std::vector<int32_t> ids;
    Result<Tensor> out = l.model->forward(b, *l.kv);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (out.ok()) {
      EXPECT_TRUE(read_token_ids(*cpu, *out, ids).ok());
    }
    return ids;
  };
  for (Loaded* l : {&plain, &padded}) ASSERT_TRUE(l->model->forward(prefill(19, 4), *l->kv).ok());

  Batch greedy = decode();
  greedy.argmax_vocab = n_vocab;
  Batch greedy8 = greedy;
  ASSERT_TRUE(pad_decode(greedy8, 8, spare));
  EXPECT_EQ(greedy8.n_tokens(), 8);
  EXPECT_EQ(greedy8.block_tables.size(), 8u);
  const std::vector<int32_t> want = run(plain, greedy), got = run(padded, greedy8);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 2), want);

  Batch sampled = decode_at(20, 5);
  sampled.sample_vocab = n_vocab;
  for (uint32_t seed : {7u, 8u})
    sampled.sample_rows.push_back({.temperature = 0.8f, .top_p = 0.95f, .seed_lo = seed, .logprobs = 1});
  Batch sampled5 = sampled;
  ASSERT_TRUE(pad_decode(sampled5, 5, spare));
  ASSERT_EQ(sampled5.sample_rows.size(), 5u);
  EXPECT_EQ(sampled5.sample_rows[4].temperature, 0.0f);  // the pads are greedy
  const std::vector<int32_t> want_s = run(plain, sampled), got_s = run(padded, sampled5);
  ASSERT_EQ(want_s.size(), 4u);  // [token, logprob] a row
  ASSERT_EQ(got_s.size(), 10u);
  EXPECT_EQ(std::vector<int32_t>(got_s.begin(), got_s.begin() + 4), want_s);

  // The positions the steps wrote, layer by layer, hold the unpadded model's bytes: sequence 0's 0..20 in
  // blocks {3, 7}, sequence 1's 0..5 in block 9.
  const KvBuffers& a = *plain.kv;
  const KvBuffers& b = *padded.kv;
  const auto slot_floats = static_cast<size_t>(a.k[0].ne[0] * a.k[0].ne[1]);
  std::vector<int32_t> slots;
  for (int32_t p = 0; p <= 20; ++p) slots.push_back(kTable0[p / 16] * 16 + p % 16);
  for (int32_t p = 0; p <= 5; ++p) slots.push_back(kTable1[0] * 16 + p);
  for (size_t layer = 0; layer < a.k.size(); ++layer) {
    for (const bool k : {true, false}) {
      const auto* x = static_cast<const float*>((k ? a.k : a.v)[layer].data);
      const auto* y = static_cast<const float*>((k ? b.k : b.v)[layer].data);
      for (const int32_t slot : slots) {
        const size_t at = static_cast<size_t>(slot) * slot_floats;
        ASSERT_TRUE(std::equal(x + at, x + at + slot_floats, y + at))
            << "layer " << layer << " slot " << slot;
      }
    }
  }

  // Only a decode step whose tokens the backend chooses is padded.
  Batch mix = mixed();
  mix.argmax_vocab = n_vocab;
  EXPECT_FALSE(pad_decode(mix, 8, spare));
  EXPECT_EQ(mix.n_tokens(), 6);
  Batch logits = decode();  // its logits come back: nothing to pad
  EXPECT_FALSE(pad_decode(logits, 8, spare));
  EXPECT_FALSE(pad_decode(greedy, 2, spare));  // already that many rows
}

// A verifying step (a token and its drafts, every row wanted) is padded with sequences of one row each, then
// empty ones, to a decode step's shapes: the real rows' argmax tokens are the unpadded step's.
TEST(StepProgram, PaddedVerifyingRowsChangeNothing) {
  std::unique_ptr<Backend> cpu = make_backend("cpu", BackendOptions{2}).value();
  Loaded plain = load(*cpu, "SmolLM2-135M-Instruct.Q4_1.gguf");
  Loaded padded = load(*cpu, "SmolLM2-135M-Instruct.Q4_1.gguf");
  ASSERT_TRUE(plain.model && padded.model);
  for (Loaded* l : {&plain, &padded}) ASSERT_TRUE(l->model->forward(prefill(19, 4), *l->kv).ok());
  Batch verify;  // sequence 0's token at 19 and two drafts, sequence 1's token at 4
  verify.block_tables = {kTable0, kTable1};
  verify.tokens = {300, 301, 302, 303};
  verify.positions = {19, 20, 21, 4};
  verify.seq = {0, 0, 0, 1};
  verify.logit_rows = {0, 1, 2, 3};
  verify.argmax_vocab = plain.model->info().n_vocab;
  Batch verify8 = verify;
  const std::vector<int32_t> spare = {15};
  ASSERT_TRUE(pad_decode(verify8, 8, spare));
  EXPECT_EQ(verify8.block_tables.size(), 8u);  // 2 sequences, 4 pads, 2 empty: a decode step's shapes
  EXPECT_TRUE(verify8.block_tables[7].empty());
  EXPECT_EQ(verify8.seq, (std::vector<int32_t>{0, 0, 0, 1, 2, 3, 4, 5}));
  std::vector<int32_t> want, got;
  Result<Tensor> a = plain.model->forward(verify, *plain.kv);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(read_token_ids(*cpu, *a, want).ok());
  Result<Tensor> b = padded.model->forward(verify8, *padded.kv);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(read_token_ids(*cpu, *b, got).ok());
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 4), want);

  // Rows out of sequence order, or a row not wanted, are not padded.
  Batch unordered = verify;
  unordered.seq = {1, 1, 1, 0};
  EXPECT_FALSE(pad_decode(unordered, 8, spare));
  Batch unwanted = verify;
  unwanted.logit_rows = {2, 3};
  EXPECT_FALSE(pad_decode(unwanted, 8, spare));
}

TEST(CheckBatch, EveryValueAnOpReadsIsChecked) {
  const std::vector<int32_t> t0 = {0, 1}, t1 = {2}, bad_block = {0, 5}, freed = {ops::kFreedBlock, 1};
  auto batch = [&](auto&&... edit) {
    Batch b;
    b.block_tables = {t0, t1};
    b.tokens = {1, 2, 3};
    b.positions = {0, 5, 1};
    b.seq = {0, 0, 1};
    b.logit_rows = {1, 2};
    (edit(b), ...);
    return b;
  };
  const KvGeometry kv{4, 4, 0};
  ASSERT_TRUE(check_batch(batch(), 10, kv).ok());
  auto expect = [&](const Batch& b, StatusCode code, std::string_view needle, KvGeometry g) {
    const Status s = check_batch(b, 10, g);
    EXPECT_EQ(s.code(), code) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect(batch([](Batch& b) { b.tokens[1] = 10; }), StatusCode::out_of_range, "tokens[1]", kv);
  expect(batch([](Batch& b) { b.positions[1] = 8; }), StatusCode::out_of_range, "positions[1]", kv);
  expect(batch([](Batch& b) { b.positions[0] = -1; }), StatusCode::out_of_range, "positions[0]", kv);
  expect(batch([](Batch& b) { b.seq[2] = 2; }), StatusCode::out_of_range, "seq[2]", kv);
  expect(batch([&](Batch& b) { b.block_tables[0] = bad_block; }), StatusCode::out_of_range,
         "block_tables[0][1] = 5", kv);
  expect(batch([&](Batch& b) { b.block_tables[0] = freed; }), StatusCode::out_of_range,
         "reads block_tables[0][0], which is freed", kv);
  // Inside a window that starts past the freed block, the same table is fine.
  EXPECT_TRUE(check_batch(batch([&](Batch& b) {
                            b.block_tables[0] = freed;
                            b.positions[0] = 5;
                          }),
                          10, KvGeometry{4, 4, 2})
                  .ok());
  expect(batch([](Batch& b) { b.logit_rows = {2, 1}; }), StatusCode::invalid_argument, "logit_rows[1]", kv);
  // Sampling masks: whole rows of ceil(sample_vocab / 32) words, each row's mask_row -1 or one of them.
  const auto sampled = [](Batch& b) {
    b.sample_vocab = 10;
    b.sample_rows.resize(2);
    b.sample_mask.assign(2, ~0u);
    b.sample_rows[1].mask_row = 1;
  };
  ASSERT_TRUE(check_batch(batch(sampled), 10, kv).ok());
  expect(batch(sampled, [](Batch& b) { b.sample_rows[0].mask_row = 2; }), StatusCode::invalid_argument,
         "sample_rows[0]: n_top 0 (at most 0), adjust [0, +0) of 0, mask_row 2 of 2", kv);
  expect(batch(sampled, [](Batch& b) { b.sample_rows[0].mask_row = -2; }), StatusCode::invalid_argument,
         "mask_row -2", kv);
  expect(batch([](Batch& b) { b.sample_mask = {1}; }), StatusCode::invalid_argument, "sample_mask", kv);
}

}  // namespace
}  // namespace kiln
