// The KL-divergence base file: a model's token distributions over a text, as llama.cpp's llama-perplexity
// writes them with --kl-divergence-base and reads them with --kl-divergence. Files interchange with it.
//
// Layout (little-endian, no padding between fields):
//   char[8]  "_logits_"
//   uint32   n_ctx                        tokens a chunk
//   int32    n_vocab
//   int32    n_chunk
//   int32    tokens[n_chunk * n_ctx]      the text's tokens, chunk after chunk, as tokenized (not
//   BOS-replaced) then, chunk after chunk, one row per scored position p in [n_ctx / 2, n_ctx - 1) (the first
//   half of a chunk is context only; p scores token p + 1): kld_row_values(n_vocab) uint16 =
//     float scale, float min_log_prob       (their 8 bytes: the row's first 4 uint16)
//     uint16 q[n_vocab]                     log p_i ~= scale * q_i + min_log_prob
//     uint16 0                              when n_vocab is odd (rows are a whole number of 4-byte words)
// The log-probabilities are the log-softmax of the logits, quantized linearly over the top 16 nats: with m
// the largest logit and l = max(smallest logit, m - 16), scale = (m - l) / 65535 and q_i = round((x_i - l) /
// scale) for x_i > l, else 0 (every logit at or below l reads back as the floor, min_log_prob = l - m - log
// sum exp).
//
// A file is read one row at a time (pread): only the tokens are held in memory. Written rows go straight to
// their place in the file, in any order (pwrite): chunks evaluated together may finish out of order.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/output_file.h"

namespace kiln::kld {

inline constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
inline constexpr float kLogProbRange = 16.0f;  // nats below the top logit that a row resolves

// uint16 values of one row: the two floats, n_vocab log-probs, padded to an even count.
inline int64_t row_values(int32_t n_vocab) { return 2 * ((int64_t{n_vocab} + 1) / 2) + 4; }
// The first position of a chunk whose next token is scored, and how many are.
inline int32_t first_scored(int32_t n_ctx) { return n_ctx / 2; }
inline int32_t n_scored(int32_t n_ctx) { return n_ctx - 1 - n_ctx / 2; }

struct Header {
  int32_t n_ctx = 0;    // tokens a chunk, >= 3 (at least one scored position)
  int32_t n_vocab = 0;  // logits a position
  int32_t n_chunk = 0;  // chunks in the file
  // Bytes before the first row: magic, the three counts, the tokens.
  uint64_t rows_offset() const;
  // Where row j (0 <= j < n_scored) of chunk c starts; the whole file's size at c = n_chunk, j = 0.
  uint64_t row_offset(int64_t c, int64_t j) const;
  uint64_t file_bytes() const { return row_offset(n_chunk, 0); }
};

// Encodes one position's logits (f32 [n_vocab]) into `row` ([row_values(n_vocab)]), llama-perplexity's way;
// returns the negative log-likelihood of `token` under the logits (-log softmax(logits)[token]).
double encode_row(std::span<const float> logits, int32_t token, std::span<uint16_t> row);

// The row's scale and floor, and log p_i of entry i: the reading side of encode_row.
struct RowView {
  float scale = 0, min_log_prob = 0;
  const uint16_t* q = nullptr;  // [n_vocab]
  float log_prob(int32_t i) const { return scale * static_cast<float>(q[i]) + min_log_prob; }
};
RowView view_row(std::span<const uint16_t> row);

// A base file being read. The header, size and tokens are checked at open: a file of another kind, counts out
// of range, a size that is not the one the header implies (truncated or with bytes after the last row), a
// token outside the vocabulary: each an error naming the file, and the offset where it goes wrong.
class Reader {
 public:
  static Result<Reader> open(const std::string& path);
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&&) = delete;
  Reader(const Reader&) = delete;
  ~Reader();

  const Header& header() const { return header_; }
  const std::string& path() const { return path_; }
  // Chunk c's tokens: [n_ctx].
  std::span<const int32_t> chunk_tokens(int64_t c) const;
  // Reads row j of chunk c into `row` ([row_values(n_vocab)]). Thread-safe (pread).
  Status read_row(int64_t c, int64_t j, std::span<uint16_t> row) const;

 private:
  Reader() = default;
  std::string path_;
  int fd_ = -1;
  Header header_;
  std::vector<int32_t> tokens_;  // [n_chunk * n_ctx]
};

// A base file being written: the header and tokens at create, then every row of every chunk once (write_row:
// in any order, from several threads at once), then commit(), which checks that as many rows were written and
// puts the file in place (formats/output_file.h: a temporary file until then; nothing is left on failure).
class Writer {
 public:
  // `tokens`: [header.n_chunk * header.n_ctx]. `model`: the model file the rows come from (never
  // overwritten).
  static Result<Writer> create(const std::string& path, const std::string& model, const Header& header,
                               std::span<const int32_t> tokens);
  Writer(Writer&& other) noexcept
      : out_(std::move(other.out_)), header_(other.header_), rows_written_(other.rows_written_.load()) {}
  Writer& operator=(Writer&&) = delete;
  Writer(const Writer&) = delete;

  // Writes row j of chunk c ([row_values(n_vocab)]) in its place. Thread-safe (pwrite).
  Status write_row(int64_t c, int64_t j, std::span<const uint16_t> row);
  Status commit();
  const Header& header() const { return header_; }

 private:
  Writer(OutputFile out, const Header& header) : out_(std::move(out)), header_(header) {}
  OutputFile out_;
  Header header_;
  std::atomic<int64_t> rows_written_{0};
};

}  // namespace kiln::kld
