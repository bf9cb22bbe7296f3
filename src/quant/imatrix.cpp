// kiln imatrix: an importance matrix from a calibration text, as llama-imatrix computes it.
//
// The text is tokenized once with the model's BOS rule (special tokens not parsed) and cut into chunks of
// chunk_size tokens; each chunk is its own sequence whose first token is replaced by BOS when the model adds
// one, and every token of it goes through the model (the collection sees all of them). Several chunks run
// in one step (up to kStepTokens tokens). The collection is the model's ProgramHook (imatrix_collector.h);
// its sums are read back after each step. The perplexity of each chunk's second half comes from the same
// step's logits, as llama-imatrix prints it.
#include "kiln/imatrix.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <system_error>

#include "backends/backend.h"
#include "core/log.h"
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "models/batch.h"
#include "models/model.h"
#include "quant/imatrix_collector.h"
#include "quant/imatrix_file.h"
#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

namespace {

using quant::ImatrixSums;

// Tokens a step runs at most (whole chunks, one at least): llama-imatrix's default batch.
constexpr int64_t kStepTokens = 2048;
// The logits a step keeps for the perplexity, in floats at most (more chunks a step would need more).
constexpr int64_t kMaxLogitFloats = int64_t{64} << 20;
constexpr int32_t kBlockSize = 16;  // KV block: tokens

Result<std::string> read_text(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return not_found("cannot read {}: {}", path, std::error_code(errno, std::generic_category()).message());
  }
  if (!S_ISREG(st.st_mode)) return invalid_argument("{} is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return io_error("cannot read {}", path);
  return text;
}

// The collected totals and where they came from, as llama-imatrix keeps them.
struct Totals {
  std::map<std::string, ImatrixSums> sums;
  std::vector<std::string> datasets;
};

// Adds an imatrix file's sums (llama-imatrix --in-file): a GGUF file's raw sums and counts as they are, a
// legacy file's values and counts times chunk_size (a call stood for chunk_size rows).
// With `full` (a run that collects Gram matrices), each one-matrix weight of the file must have one, and
// without it none may: the Gram matrices would otherwise cover other tokens than the sums.
Status load_in_file(const std::string& path, int64_t chunk_size, bool full, Totals& t) {
  KILN_ASSIGN_OR_RETURN(quant::Imatrix im, quant::read_imatrix(path));
  const double scale = im.legacy ? static_cast<double>(chunk_size) : 1.0;
  for (auto& [name, tensor] : im.tensors) {
    if (full && tensor.n_mat == 1 && !tensor.has_gram())
      return invalid_argument("--full: {} has no Gram matrix for {} (made without --full)", path, name);
    if (!full && tensor.has_gram())
      return invalid_argument("{} holds Gram matrices (made with --full): collect with --full too", path);
    ImatrixSums s;
    s.n_cols = tensor.n_cols;
    for (const float v : tensor.sum2) s.sum2.push_back(v * scale);
    for (const float c : tensor.counts) s.counts.push_back(c * scale);
    const std::span<const float> gram = tensor.gram_values();  // the file's: summed into a copy
    s.gram.assign(gram.begin(), gram.end());
    s.amax.assign(tensor.amax.begin(), tensor.amax.end());
    KILN_TRY(quant::add_sums(name, s, t.sums[name]));
  }
  t.datasets.insert(t.datasets.end(), im.datasets.begin(), im.datasets.end());
  return Status::ok_status();
}

// The file's contents: every weight's sums and counts in f32, chunk_count = the most rows any weight saw over
// chunk_size (llama-imatrix's count). `partial`: weights some of whose matrices saw no row. The Gram matrices
// are moved out of `t`, not copied.
quant::Imatrix to_imatrix(Totals& t, const std::vector<std::string>& datasets, int64_t chunk_size,
                          int64_t& partial) {
  quant::Imatrix im;
  im.datasets = datasets;
  im.chunk_size = chunk_size;
  double most = 0;
  partial = 0;
  for (auto& [name, s] : t.sums) {
    quant::ImatrixTensor& q = im.tensors[name];
    q.n_mat = s.n_mat();
    q.n_cols = static_cast<int64_t>(s.sum2.size()) / q.n_mat;
    q.sum2.assign(s.sum2.begin(), s.sum2.end());
    q.counts.assign(s.counts.begin(), s.counts.end());
    q.gram = std::move(s.gram);
    q.amax.assign(s.amax.begin(), s.amax.end());
    bool some_zero = false;
    for (const double c : s.counts) most = std::max(most, c), some_zero |= c == 0;
    partial += some_zero ? 1 : 0;
  }
  im.chunk_count = chunk_size > 0 ? static_cast<int64_t>(most) / chunk_size : 0;
  return im;
}

// Negative log-likelihoods of the scored tokens: llama-imatrix's perplexity and its error.
struct Nll {
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  void add(const float* logits, int64_t n_vocab, int32_t token) {
    float mx = logits[0];
    for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
    double z = 0;
    for (int64_t i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
    const double nll = -(static_cast<double>(logits[token]) - mx - std::log(z));
    sum += nll, sum2 += nll * nll, ++count;
  }
  double ppl() const { return count > 0 ? std::exp(sum / static_cast<double>(count)) : 0.0; }
  double ppl_error() const {
    if (count < 2) return 0.0;
    const double n = static_cast<double>(count), mean = sum / n, var = sum2 / n - mean * mean;
    return var > 0 ? ppl() * std::sqrt(var / (n - 1)) : 0.0;
  }
};

// The model, its backend and tokenizer, and KV pools for `n_seq` chunks.
struct Loaded {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<KvBuffers> kv;
};

Result<Loaded> load(const ImatrixOptions& o, quant::ImatrixCollector& collector) {
  Loaded l;
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(o.model, ec);
  if (folder) {
    KILN_ASSIGN_OR_RETURN(l.file, import_hf_folder(o.model));
  } else {
    KILN_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(o.model));
    l.file = std::make_shared<const gguf::File>(std::move(f));
  }
  BackendOptions bo;
  bo.n_threads = o.threads;
  bo.precision = o.exact ? ops::Precision::precision_exact : ops::Precision::precision_fast;
  KILN_ASSIGN_OR_RETURN(l.backend, make_backend(o.device, bo));
  ModelOptions mo;
  mo.n_ctx = o.chunk_size;
  mo.program_hook = &collector;
  KILN_ASSIGN_OR_RETURN(l.model, load_model(l.file, *l.backend, mo));
  collector.attach(l.model->weights());
  KILN_ASSIGN_OR_RETURN(Tokenizer tok, folder ? load_tokenizer(o.model) : Tokenizer::from_gguf(*l.file));
  if (tok.n_vocab() > l.model->info().n_vocab) {
    return invalid_argument("{}: the tokenizer has {} tokens but token_embd.weight has only {} rows", o.model,
                            tok.n_vocab(), l.model->info().n_vocab);
  }
  l.tokenizer.emplace(std::move(tok));
  return l;
}

Status check_options(const ImatrixOptions& o) {
  if (o.chunk_size < 2) return invalid_argument("chunk_size = {} must be >= 2 tokens", o.chunk_size);
  if (o.output_frequency < 0)
    return invalid_argument("output_frequency = {} must be >= 0", o.output_frequency);

  if (o.text_file.empty() && o.in_files.empty())
    return invalid_argument("no text to run and no imatrix files to combine");
  if (!o.text_file.empty() && o.model.empty()) return invalid_argument("no model to run the text through");
  KILN_TRY(check_output_path(o.output));
  for (const std::string* in : {&o.model, &o.text_file}) {
    if (!in->empty()) KILN_TRY(check_output_not_input(o.output, *in));
  }
  for (const std::string& in : o.in_files) KILN_TRY(check_output_not_input(o.output, in));
  return Status::ok_status();
}

// Moves the Gram matrices out of `t`: with them, only the last write may come here.
Status write(Totals& t, const std::vector<std::string>& datasets, const ImatrixOptions& o,
             ImatrixStats& stats) {
  const quant::Imatrix im = to_imatrix(t, datasets, o.chunk_size, stats.partial);
  stats.entries = static_cast<int64_t>(im.tensors.size());
  return quant::write_imatrix(im, o.output);
}

}  // namespace

Result<ImatrixStats> compute_imatrix(const ImatrixOptions& o) {
  KILN_TRY(check_options(o));
  Totals totals;
  for (const std::string& in : o.in_files) KILN_TRY(load_in_file(in, o.chunk_size, o.full, totals));
  ImatrixStats stats;
  std::vector<std::string> datasets = totals.datasets;
  if (o.text_file.empty()) {  // combining files only
    KILN_TRY(write(totals, datasets, o, stats));
    return stats;
  }
  datasets.push_back(o.text_file);
  KILN_ASSIGN_OR_RETURN(const std::string text, read_text(o.text_file));
  quant::ImatrixCollector collector(o.process_output, o.full);
  KILN_ASSIGN_OR_RETURN(Loaded l, load(o, collector));
  const Tokenizer& tok = *l.tokenizer;
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  const int64_t c = o.chunk_size, n_vocab = l.model->info().n_vocab;
  stats.model_name = l.model->info().name;
  stats.device = std::string(l.backend->name());
  stats.text_tokens = static_cast<int64_t>(tokens.size());
  if (stats.text_tokens < 2 * c) {
    return invalid_argument(
        "{} is {} tokens; a chunk of {} (-c) needs at least {}: give a longer text or a "
        "smaller chunk",
        o.text_file, tokens.size(), c, 2 * c);
  }
  int64_t n_chunks = stats.text_tokens / c;
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);
  const int64_t first = c / 2;  // the first position whose next token is scored
  const int64_t scored = c - 1 - first,
                logit_rows = (o.process_output ? c : 0) + (o.compute_ppl ? scored : 0);
  int64_t n_seq = std::max<int64_t>(1, kStepTokens / c);
  if (logit_rows > 0) n_seq = std::clamp<int64_t>(kMaxLogitFloats / (logit_rows * n_vocab), 1, n_seq);
  n_seq = std::min(n_seq, n_chunks);
  const int64_t blocks_per_chunk = (c + kBlockSize - 1) / kBlockSize;
  const DType kv_type = o.exact ? DType::f32 : l.backend->preferred_kv_type();
  KILN_ASSIGN_OR_RETURN(
      KvBuffers kv,
      KvBuffers::allocate(*l.model, kBlockSize, static_cast<int32_t>(n_seq * blocks_per_chunk), kv_type));
  std::vector<int32_t> tables(static_cast<size_t>(n_seq * blocks_per_chunk));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);

  const bool add_bos = tok.add_bos() && tok.bos_id() >= 0;
  Nll nll;
  ImatrixProgress progress;
  progress.n_chunks = n_chunks;
  Batch batch;
  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < n_chunks;) {
    const int64_t k = std::min(n_seq, n_chunks - done);
    batch.clear();
    for (int64_t s = 0; s < k; ++s) {
      const int64_t start = (done + s) * c, row0 = s * c;
      batch.block_tables.emplace_back(tables.data() + s * blocks_per_chunk,
                                      static_cast<size_t>(blocks_per_chunk));
      for (int64_t j = 0; j < c; ++j) {
        batch.tokens.push_back(j == 0 && add_bos ? tok.bos_id() : tokens[static_cast<size_t>(start + j)]);
        batch.positions.push_back(static_cast<int32_t>(j));
        batch.seq.push_back(static_cast<int32_t>(s));
        // Every row for the output head's statistics; else the scored rows for the perplexity.
        if (o.process_output || (o.compute_ppl && j >= first && j < c - 1))
          batch.logit_rows.push_back(static_cast<int32_t>(row0 + j));
      }
    }
    KILN_ASSIGN_OR_RETURN(const Tensor out, l.model->forward(batch, kv));
    KILN_TRY(read_logits(l.model->output_backend(), out, logits));
    KILN_TRY(collector.read_back(totals.sums));
    for (int64_t s = 0; s < k && o.compute_ppl; ++s) {
      const int64_t start = (done + s) * c;
      for (int64_t j = first; j < c - 1; ++j) {
        // The j-th logit row of chunk s: all c rows of each chunk before it are kept under process_output.
        const int64_t row = o.process_output ? s * c + j : s * scored + (j - first);
        nll.add(logits.data() + row * n_vocab, n_vocab, tokens[static_cast<size_t>(start + j + 1)]);
      }
      progress.chunk_ppl.push_back(nll.ppl());
    }
    const int64_t before = done;
    done += k;
    progress.chunks_done = done;
    progress.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.ppl = nll.ppl();
    if (o.progress) o.progress(progress);
    // With --full, the Gram matrices are read back once, at the end: no file before then.
    if (!o.full && o.output_frequency > 0 && done < n_chunks &&
        done / o.output_frequency > before / o.output_frequency)
      KILN_TRY(write(totals, datasets, o, stats));
  }
  KILN_TRY(collector.take_grams(totals.sums));
  stats.chunks = n_chunks;
  stats.seconds = progress.seconds;
  stats.tokens_per_second = static_cast<double>(n_chunks * c) / std::max(stats.seconds, 1e-9);
  stats.ppl = nll.ppl();
  stats.ppl_error = nll.ppl_error();
  KILN_TRY(write(totals, datasets, o, stats));
  return stats;
}

}  // namespace kiln
