// Engine setup: the model file, backends (placed by runtime/placement/), model, tokenizer, chat template, and
// the KV pool sized by the memory budget (runtime/kv_cache/kv_budget.h) under the scheduler.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "core/log.h"
#include "engine_impl.h"
#include "formats/hf_config.h"
#include "grammar/vocabulary.h"
#include "models/tp_model.h"
#include "runtime/env_options.h"
#include "runtime/kv_cache/kv_budget.h"
#include "runtime/placement/placement.h"
#include "tokenizer/load.h"

namespace kiln {

namespace {
// The longest context an engine serves (2^24 tokens): far past any model's, small enough that no size derived
// from it overflows.
constexpr int32_t kMaxContext = 1 << 24;
// Compiled grammars kept for reuse (GrammarCache): a server's requests mostly repeat a few schemas.
constexpr size_t kGrammarCacheEntries = 64;
// And the bytes their masks may hold: a hostile stream of distinct grammars costs recompiling, not memory.
constexpr size_t kGrammarCacheBytes = size_t{512} << 20;
}  // namespace

Status Engine::Impl::load(const EngineOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  options = opt;
  profile.on = runtime_env_options().step_profile;
  if (opt.n_threads < 0) return invalid_argument("n_threads = {} must be >= 0", opt.n_threads);
  if (opt.n_ctx < 0 || opt.n_ctx > kMaxContext)
    return invalid_argument("n_ctx = {} must be in [0, {}] tokens (0 = the model's, at most 4096)", opt.n_ctx,
                            kMaxContext);
  if (opt.n_seq_max < 1 || opt.n_seq_max > 4096)
    return invalid_argument("n_seq_max = {} must be in [1, 4096]", opt.n_seq_max);
  if (opt.keep_finished < 0) return invalid_argument("keep_finished = {} must be >= 0", opt.keep_finished);
  if (opt.queue_timeout_ms < 0)
    return invalid_argument("queue_timeout_ms = {} must be >= 0 (0: no limit)", opt.queue_timeout_ms);
  if (opt.max_queued < 0)
    return invalid_argument("max_queued = {} must be >= 0 (0: no limit)", opt.max_queued);
  if (opt.offload_min_tokens < 0)
    return invalid_argument("offload_min_tokens = {} must be >= 0 (0: never)", opt.offload_min_tokens);
  if (opt.max_batch_tokens < 0)
    return invalid_argument("max_batch_tokens = {} must be >= 0 (0: by device)", opt.max_batch_tokens);
  if (opt.tensor_parallel < 1 || opt.tensor_parallel > 64)
    return invalid_argument("tensor_parallel = {} must be in [1, 64]", opt.tensor_parallel);
  if (opt.tensor_parallel > 1 && opt.gpu_layers != -1) {
    return invalid_argument("tensor_parallel = {} with gpu_layers = {}: partial offload splits no rank",
                            opt.tensor_parallel, opt.gpu_layers);
  }
  if (opt.kv_block_size < 1 || opt.kv_block_size > 1024) {
    return invalid_argument("kv_block_size = {} must be in [1, 1024]", opt.kv_block_size);
  }
  if (options.speculation.empty() && !opt.draft_model.empty()) options.speculation = "draft";
  const std::string& spec = options.speculation;
  if (!spec.empty() && spec != "none" && spec != "ngram" && spec != "draft") {
    return invalid_argument("speculation = \"{}\" is not supported (none, ngram, draft)", spec);
  }
  if (spec == "draft" && opt.draft_model.empty())
    return invalid_argument("speculation = \"draft\" needs a draft model (draft_model, --draft-model)");
  if (spec != "draft" && !opt.draft_model.empty())
    return invalid_argument("draft_model is set but speculation = \"{}\" does not use it", spec);
  if (!(opt.draft_p_min >= 0.0f && opt.draft_p_min <= 1.0f))
    return invalid_argument("draft_p_min = {} must be in [0, 1]", opt.draft_p_min);
  if (opt.draft_max < 1 || opt.draft_max > 64)
    return invalid_argument("draft_max = {} must be in [1, 64]", opt.draft_max);
  if (opt.kv_type != "f32" && opt.kv_type != "f16" && opt.kv_type != "q8_0" && opt.kv_type != "q8_64" &&
      opt.kv_type != "auto") {
    return invalid_argument("kv_type = \"{}\" is not supported (f32, f16, q8_0, q8_64, auto)", opt.kv_type);
  }
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(opt.model_path, ec);
  std::shared_ptr<gguf::File> gguf_file;  // a GGUF file's, while it loads (released metadata below)
  if (folder) {
    KILN_ASSIGN_OR_RETURN(file, import_hf_folder(opt.model_path, false, /*activation_scales=*/true));
  } else {
    KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(opt.model_path));
    gguf_file = std::make_shared<gguf::File>(std::move(f));
    file = gguf_file;
  }
  // The context decides Phi-3's LongRoPE factors, so it is fixed before the model loads.
  int32_t n_ctx_train = 4096;
  if (const std::string arch = file->architecture(); file->find(arch + ".context_length") != nullptr) {
    KILN_ASSIGN_OR_RETURN(const uint64_t c, file->get_uint(arch + ".context_length"));
    n_ctx_train = static_cast<int32_t>(std::min<uint64_t>(c, 1u << 30));
  }
  const int32_t n_ctx = opt.n_ctx > 0 ? opt.n_ctx : std::min(n_ctx_train, 4096);
  ModelOptions model_options;
  model_options.n_ctx = n_ctx;
  KILN_TRY(make_backends(*file, model_options));
  const bool device = !backend->host_memory();
  speculate = spec == "ngram" || spec == "draft";
  // A verifying step's rows run as a prompt chunk's do; a model split between a device and the host is not
  // checked with them yet.
  if (speculate && host_backend != nullptr) {
    return unimplemented("speculation \"{}\" needs the whole model on {} (some layers are on the CPU)", spec,
                         backend->name());
  }
  if (options.max_batch_tokens == 0)
    options.max_batch_tokens = device ? kDeviceBatchTokens : kHostBatchTokens;
  const DType kv_type = opt.kv_type == "f16"     ? DType::f16
                        : opt.kv_type == "q8_0"  ? DType::q8_0
                        : opt.kv_type == "q8_64" ? DType::q8_64
                        : opt.kv_type == "auto"  ? backend->preferred_kv_type()
                                                 : DType::f32;
  // The model before the tokenizer: what a file is (its architecture) is the first thing to report on.
  if (options.tensor_parallel > 1) {
    std::vector<Backend*> ranks{backend.get()};
    for (const auto& b : tp_backends) ranks.push_back(b.get());
    KILN_ASSIGN_OR_RETURN(tp_group, make_collective_group(ranks));
    KILN_ASSIGN_OR_RETURN(model, load_tp_model(file, ranks, *tp_group, model_options));
  } else {
    KILN_ASSIGN_OR_RETURN(model, load_model(file, *backend, model_options));
  }
  KILN_ASSIGN_OR_RETURN(Tokenizer tok, folder ? load_tokenizer(opt.model_path) : Tokenizer::from_gguf(*file));
  const ModelInfo& mi = model->info();
  {
    // Whether the backend that holds the logits draws tokens (ops::Sample): its types are what it answers on.
    Tensor x, i;
    x.type = DType::f32;
    i.type = DType::i32;
    backend_samples = model->output_backend().supports(ops::Sample{x, i, i, i, i});
  }
  if (device && kv_type != DType::f32 && kv_type != DType::f16) {
    // Whether the device writes and reads pools of this type at the model's head size.
    Tensor x, pool, i;
    x.type = DType::f32, x.ne[0] = mi.head_dim;
    pool.type = kv_type, pool.ne[0] = mi.head_dim;
    i.type = DType::i32;
    if (!backend->supports(ops::KvWrite{x, x, pool, pool, i}) ||
        !backend->supports(ops::Attention{x, pool, pool, i, i, i, i, 1.0f, 0.0f, 0, x})) {
      return unimplemented("kv_type \"{}\" with head_dim {}: {} does not run such a KV cache", opt.kv_type,
                           mi.head_dim, backend->name());
    }
  }
  if (tok.n_vocab() > mi.n_vocab) {
    return invalid_argument("{}: the tokenizer has {} tokens but token_embd.weight has only {} rows",
                            file->name(), tok.n_vocab(), mi.n_vocab);
  }
  tokenizer.emplace(std::move(tok));
  vocab = grammar::vocabulary_from(*tokenizer);
  grammars = std::make_unique<GrammarCache>(vocab, kGrammarCacheEntries, kGrammarCacheBytes);
  // The vocabulary's arrays are read once, by the tokenizer: held as metadata values they would cost ~48
  // bytes an entry for the whole run (Gemma 3: 262,144 entries in each).
  if (gguf_file != nullptr) {
    for (const char* key : {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                            "tokenizer.ggml.merges"}) {
      gguf_file->release(key);
    }
  }
  KILN_TRY(load_chat_template(opt.model_path, folder));
  // On a device, whose decode steps may be padded (pad()), the pool's last block is the pads' spare: the
  // cache hands out the others, so the pool holds one block more than the sequences need.
  const bool spare = device && host_backend == nullptr;
  KILN_ASSIGN_OR_RETURN(const int32_t n_pool, size_kv_pool(mi, n_ctx, kv_type, spare ? 1 : 0));
  KILN_ASSIGN_OR_RETURN(KvBuffers buffers, KvBuffers::allocate(*model, opt.kv_block_size, n_pool, kv_type));
  kv = std::make_unique<KvBuffers>(std::move(buffers));
  if (kv->bytes() != static_cast<uint64_t>(n_pool) * kv_block_bytes) {
    return make_status(StatusCode::internal, "KV cache: {} bytes allocated for {} blocks of {} bytes",
                       kv->bytes(), n_pool, kv_block_bytes);
  }
  const int32_t n_blocks = n_pool - (spare && n_pool > 1 ? 1 : 0);
  spare_block = n_blocks < n_pool ? n_blocks : -1;
  KILN_TRY(warm_up(n_blocks));
  KILN_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(n_blocks, opt.kv_block_size));
  kv_windowed = mi.kv_window > 0;
  SchedulerOptions so;
  so.max_running = opt.n_seq_max;
  so.max_batch_tokens = options.max_batch_tokens;
  so.kv_window = mi.kv_window;
  KILN_ASSIGN_OR_RETURN(Scheduler sched, Scheduler::create(so, std::move(cache)));
  scheduler.emplace(std::move(sched));
  if (spec == "draft") {
    DraftModelOptions dm;
    dm.n_ctx = n_ctx;
    dm.block_size = opt.kv_block_size;
    dm.n_blocks = n_blocks;  // as many positions as the model's pool
    dm.kv_type = kv_type;
    dm.p_min = opt.draft_p_min;
    dm.max_catch_up = options.max_batch_tokens;
    KILN_ASSIGN_OR_RETURN(draft_model, DraftModel::load(opt.draft_model, *backend, *tokenizer, dm));
    log_info("draft model {}: {} layers, {:.1f} M parameters, {:.1f} MiB of K/V", draft_model->info().name,
             draft_model->info().n_layers, static_cast<double>(draft_model->info().n_params) / 1e6,
             static_cast<double>(draft_model->kv_bytes()) / 1048576.0);
  }
  publish_locked();  // the pool's gauges, before any step (no other thread exists yet)

  desc.path = opt.model_path;
  desc.name = mi.name;
  desc.architecture = mi.architecture;
  desc.n_vocab = tokenizer->n_vocab();
  desc.n_ctx = n_ctx;
  desc.n_ctx_train = mi.n_ctx_train;
  desc.n_layers = mi.n_layers;
  desc.n_embd = mi.n_embd;
  desc.n_params = mi.n_params;
  desc.weight_bytes = mi.weight_bytes;
  for (const std::unique_ptr<WeightHandle>& h : model->weights()) {
    if (h->prepared != nullptr) desc.prepared_bytes += h->prepared->bytes();
    if (h->storage != nullptr) desc.prepared_bytes += h->storage->size();
  }
  desc.kv_bytes = kv->bytes();
  desc.kv_blocks = n_blocks;
  desc.kv_block_size = opt.kv_block_size;
  desc.kv_type = dtype_name(kv_type);
  desc.n_threads = (host_backend != nullptr ? host_backend : backend)->n_threads();
  desc.backend = std::string(backend->name());
  if (!tp_backends.empty()) desc.backend += fmt::format(" (tensor parallel over {})", tp_backends.size() + 1);
  desc.n_gpu_layers = device ? mi.n_layers : 0;
  if (host_backend != nullptr) {
    desc.backend += " + cpu";
    desc.n_gpu_layers = model_options.n_first_layers;
  }
  desc.has_chat_template = chat_template.has_value();
  if (chat_template) desc.chat_template = chat_template->source();
  desc.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return Status::ok_status();
}

Status Engine::Impl::make_backends(const gguf::File& f, ModelOptions& model_options) {
  int32_t g = options.gpu_layers;
  if (g < -1) return invalid_argument("gpu_layers = {} must be >= 0, or -1 for every layer", g);
  // Every backend of the engine (the host's too, under partial offload) computes at one precision.
  BackendOptions bo;
  bo.n_threads = options.n_threads;
  bo.precision =
      options.quantize_activations ? ops::Precision::precision_fast : ops::Precision::precision_exact;
  bo.batch_invariant = options.deterministic;
  if (options.tensor_parallel > 1) return make_tp_backends(bo);
  KILN_ASSIGN_OR_RETURN(backend, make_backend(options.backend, bo));
  if (backend->host_memory()) {
    if (g == -1) return Status::ok_status();
    if (options.backend == "cpu") {
      return invalid_argument(
          "gpu_layers = {}: the backend is \"cpu\"; offloading layers needs a GPU backend", g);
    }
    log_warn("gpu_layers = {} is ignored: there is no usable CUDA device, the model runs on the CPU", g);
    return Status::ok_status();
  }
  const std::string key = f.architecture() + ".block_count";
  if (f.find(key) == nullptr) return Status::ok_status();  // load_model() says what is missing
  KILN_ASSIGN_OR_RETURN(const uint64_t count, f.get_uint(key));
  const auto n_layers = static_cast<int32_t>(std::min<uint64_t>(count, 1 << 20));
  if (g == -1) {  // every layer, unless the weights do not fit
    const GpuFitInput fit = gpu_fit_input(f, n_layers, backend->device_memory_free());
    g = fit_gpu_layers(fit);
    if (g < n_layers) {
      uint64_t weights = fit.first_bytes + fit.last_bytes;
      for (const uint64_t b : fit.layer_bytes) weights += b;
      log_warn(
          "the model's {:.2f} GiB of weights do not fit in {:.2f} GiB of the GPU's {:.2f} GiB free "
          "(the rest is kept for the KV cache and scratch): the first {} of its {} layers run on the GPU, "
          "the rest on the CPU (--gpu-layers N chooses)",
          weights / 1073741824.0, (fit.free - std::min(fit.free, fit.reserve)) / 1073741824.0,
          fit.free / 1073741824.0, g, n_layers);
    }
  }
  if (g >= n_layers) return Status::ok_status();
  KILN_ASSIGN_OR_RETURN(host_backend, make_backend("cpu", bo));
  if (g == 0) {  // nothing on the GPU
    backend = std::move(host_backend);
    return Status::ok_status();
  }
  model_options.rest = host_backend.get();
  model_options.n_first_layers = g;
  if (options.offload_min_tokens > 0) {
    OffloadOptions oo;
    oo.min_tokens = options.offload_min_tokens;
    oo.print_profile = runtime_env_options().step_profile;
    offload = std::make_unique<OffloadRunner>(oo);
    model_options.host_stage = offload.get();
  }
  return Status::ok_status();
}

Status Engine::Impl::make_tp_backends(BackendOptions bo) {
  const int32_t n = options.tensor_parallel;
  const std::string& name = options.backend;
  const bool cpu = name == "cpu" || (name == "auto" && !cuda_available());
  int first = 0;  // rank 0's CUDA device
  if (cpu) {
    // The ranks share the threads asked for (each at least one).
    const int total = bo.n_threads > 0 ? bo.n_threads : static_cast<int>(std::thread::hardware_concurrency());
    bo.n_threads = std::max(1, total / n);
  } else if (name != "auto") {
    Result<int> device = cuda_device_index(name);
    if (!device.ok())
      return invalid_argument("tensor_parallel = {}: backend \"{}\" is not cpu, cuda, cuda:N or auto", n,
                              name);
    first = device.value();
  }
  for (int32_t r = 0; r < n; ++r) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b,
                          make_backend(cpu ? std::string("cpu") : fmt::format("cuda:{}", first + r), bo));
    if (r == 0) {
      backend = std::move(b);
    } else {
      tp_backends.push_back(std::move(b));
    }
  }
  return Status::ok_status();
}

// On a device backend, a step of one token, one of a batch and a decode step of many before any request: a
// GPU loads each kernel the first time it runs and cuBLAS picks its algorithms, tens of milliseconds that
// would otherwise land on the first request. The steps write K/V into blocks no sequence owns yet (a sequence
// writes its blocks before it reads them). The CPU has nothing to load.
Status Engine::Impl::warm_up(int32_t n_blocks) {
  if (backend->device_memory_free() == 0) return Status::ok_status();
  const int32_t bs = options.kv_block_size;
  const int32_t capacity = n_blocks * bs;
  std::vector<int32_t> table(static_cast<size_t>(n_blocks));
  for (int32_t b = 0; b < n_blocks; ++b) table[static_cast<size_t>(b)] = b;
  for (const int32_t n : {1, std::min({64, options.max_batch_tokens, capacity})}) {
    batch.clear();
    for (int32_t t = 0; t < n; ++t) {
      batch.tokens.push_back(0);
      batch.positions.push_back(t);
      batch.seq.push_back(0);
    }
    batch.block_tables.emplace_back(table.data(), static_cast<size_t>((n + bs - 1) / bs));
    batch.logit_rows.push_back(n - 1);
    Clock::time_point launched;
    KILN_TRY(run_forward(launched));
    if (n == 1) {  // and a greedy decode step, which ends in an argmax, and a sampled one
      batch.argmax_vocab = tokenizer->n_vocab();
      KILN_TRY(run_forward(launched));
      if (backend_samples) {
        batch.argmax_vocab = 0;
        batch.sample_vocab = tokenizer->n_vocab();
        batch.sample_rows.push_back(ops::SampleRow{.temperature = 1.0f});
        KILN_TRY(run_forward(launched));
      }
    }
  }
  // Then a one-token decode step padded (pad_decode) to as many rows as a step replays, greedy and sampled:
  // the backend's scratch and the model's arena are then as large as a replayed step needs, so that each new
  // batch size (or padded verifying step) is captured at its first step, not first run op by op to grow
  // them (on an H100 about 13 ms a size for the 135M model). Then one greedy step of every smaller padded
  // size: each size's GEMMs take kernels of their own, which the GPU loads at their first launch (CUDA's
  // lazy loading: cuBLAS's kernel libraries, 100 ms in all for the 135M model's first verifying steps).
  if (const int32_t max_rows = backend->replayed_rows_max(); max_rows > 1 && spare_block >= 0) {
    std::vector<std::pair<int32_t, bool>> steps = {{max_rows, false}};  // (rows, sampled)
    if (backend_samples) steps.emplace_back(max_rows, true);
    for (int32_t rows = max_rows - 1; rows > 1; --rows) {
      if (backend->padded_rows(rows) == rows) steps.emplace_back(rows, false);
    }
    for (const auto& [rows, sampled] : steps) {
      batch.clear();
      batch.tokens.push_back(0);
      batch.positions.push_back(0);
      batch.seq.push_back(0);
      batch.block_tables.emplace_back(table.data(), 1);
      batch.logit_rows.push_back(0);
      if (sampled) {
        batch.sample_vocab = tokenizer->n_vocab();
        batch.sample_rows.push_back(ops::SampleRow{.temperature = 1.0f});
      } else {
        batch.argmax_vocab = tokenizer->n_vocab();
      }
      Clock::time_point launched;
      if (pad_decode(batch, rows, {&spare_block, 1})) KILN_TRY(run_forward(launched));
    }
  }
  batch.clear();
  return Status::ok_status();
}

Result<int32_t> Engine::Impl::size_kv_pool(const ModelInfo& mi, int32_t n_ctx, DType kv_type, int32_t extra) {
  const int32_t bs = options.kv_block_size;
  // K and V of every layer: [head_dim, n_kv_heads, block_size] each (models/model.h, KvBuffers).
  KILN_ASSIGN_OR_RETURN(const int64_t layer_bytes,
                        dtype_row_bytes(kv_type, int64_t{mi.head_dim} * mi.n_kv_heads * bs));
  kv_block_bytes = uint64_t{2} * static_cast<uint64_t>(mi.n_layers) * static_cast<uint64_t>(layer_bytes);
  if (kv_block_bytes == 0) {
    return invalid_argument("{}: n_layers = {}, n_kv_heads = {}, head_dim = {} leave no room for a KV cache",
                            file->name(), mi.n_layers, mi.n_kv_heads, mi.head_dim);
  }
  KvBudgetInput in;
  in.budget_bytes = options.kv_memory_bytes;
  in.block_bytes = kv_block_bytes;
  in.full_blocks = (int64_t{n_ctx} + bs - 1) / bs * options.n_seq_max + extra;
  if (in.budget_bytes == 0) {
    const uint64_t device_free = backend->device_memory_free();
    in.mem_available = device_free > 0 ? std::optional<uint64_t>(device_free) : mem_available_bytes();
    if (host_backend != nullptr && device_free > 0) {
      // Split: a block's share of each memory is its layers'; the pool is what the tighter one holds, given
      // as memory for whole blocks.
      const auto n = static_cast<uint64_t>(mi.n_layers);
      auto n_gpu = uint64_t{0};
      for (int32_t l = 0; l < mi.n_layers; ++l) n_gpu += &model->layer_backend(l) == backend.get() ? 1 : 0;
      uint64_t whole = device_free / n_gpu * n;
      if (const std::optional<uint64_t> host = mem_available_bytes())
        whole = std::min(whole, *host / (n - n_gpu) * n);
      in.mem_available = whole;
    }
  }
  KILN_ASSIGN_OR_RETURN(const int64_t n_blocks, kv_blocks_for_budget(in));
  if (n_blocks < in.full_blocks && in.budget_bytes == 0) {
    log_warn(
        "KV cache: half of the available memory holds {} blocks of {} tokens, fewer than the {} that {} "
        "sequences of {} tokens need; requests may be preempted (set --kv-memory / kv_memory_bytes)",
        n_blocks, bs, in.full_blocks, options.n_seq_max, n_ctx);
  }
  return static_cast<int32_t>(n_blocks);
}

Status Engine::Impl::load_chat_template(const std::string& path, bool folder) {
  std::string src;
  if (folder) {
    KILN_ASSIGN_OR_RETURN(hf::ModelFolder f, hf::ModelFolder::open(path));
    if (f.tokenizer_config && f.tokenizer_config->chat_template() != nullptr)
      src = f.tokenizer_config->chat_template()->source;
  } else if (file->find("tokenizer.chat_template") != nullptr) {
    KILN_ASSIGN_OR_RETURN(src, file->get_string("tokenizer.chat_template"));
  }
  if (src.empty()) return Status::ok_status();
  auto parsed = ChatTemplate::parse(src);
  if (parsed.ok()) {
    chat_template.emplace(std::move(parsed).value());
  } else {
    log_warn("{}: the chat template cannot be used: {}", path, parsed.status().message());
  }
  return Status::ok_status();
}

namespace {

// `text` as a JSON object for the template (an empty text: {}); `what` names it in the error.
Result<nlohmann::ordered_json> json_object_arg(const std::string& text, const std::string& what) {
  if (text.empty()) return nlohmann::ordered_json::object();
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("chat: {} is not a JSON object", what);
  return j;
}

}  // namespace

// Messages and tools as Hugging Face's apply_chat_template gets them from an OpenAI request (as vLLM passes
// them): tool calls {id, type, function: {name, arguments}} with the arguments parsed into an object, and the
// keys a message does not use left out (templates test `'tool_calls' in message` and `is defined`).
Result<std::string> Engine::Impl::render_chat(const std::vector<ChatMessage>& messages,
                                              const std::vector<ToolDefinition>& tools) const {
  if (!chat_template) return invalid_argument("{}: the model has no usable chat template", file->name());
  ChatTemplateInputs in;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role.empty()) return invalid_argument("chat: messages[{}] has no role", i);
    nlohmann::ordered_json j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      auto calls = nlohmann::ordered_json::array();
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& c = m.tool_calls[k];
        KILN_ASSIGN_OR_RETURN(
            auto args,
            json_object_arg(c.arguments, fmt::format("messages[{}].tool_calls[{}].arguments", i, k)));
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", std::move(args)}}}});
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    in.messages.push_back(std::move(j));
  }
  if (!tools.empty()) {
    in.tools = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ToolDefinition& t = tools[i];
      if (t.name.empty()) return invalid_argument("chat: tools[{}] has no name", i);
      nlohmann::ordered_json f = {{"name", t.name}};
      if (!t.description.empty()) f["description"] = t.description;
      if (!t.parameters.empty()) {
        KILN_ASSIGN_OR_RETURN(f["parameters"],
                              json_object_arg(t.parameters, fmt::format("tools[{}].parameters", i)));
      }
      in.tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
  }
  in.add_generation_prompt = true;
  in.bos_token = tokenizer->bos_id() >= 0 ? tokenizer->token_to_piece(tokenizer->bos_id()) : "";
  in.eos_token = tokenizer->eos_id() >= 0 ? tokenizer->token_to_piece(tokenizer->eos_id()) : "";
  return chat_template->render(in);
}

}  // namespace kiln
