#include "quant/kld_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

namespace kiln::kld {

namespace {

constexpr uint64_t kHeaderBytes = sizeof(kMagic) + 3 * sizeof(int32_t);
constexpr int64_t kMaxCount = int64_t{1} << 24;  // n_ctx and n_vocab at most
constexpr int64_t kMaxTokens = INT32_MAX;        // n_chunk * n_ctx at most

// Reads exactly `n` bytes at `offset`; how many were read when the file ends first (errno set on failure).
int64_t pread_all(int fd, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<int64_t>(done);
}

// What lies at `offset` of a file with header `h`: the name of the field or row, for error messages.
std::string place(const Header& h, uint64_t offset) {
  if (offset < h.rows_offset()) {
    const uint64_t t = (offset - kHeaderBytes) / sizeof(int32_t);
    return fmt::format("token {} (chunk {})", t, t / static_cast<uint64_t>(h.n_ctx));
  }
  const uint64_t row_bytes = static_cast<uint64_t>(row_values(h.n_vocab)) * sizeof(uint16_t);
  const uint64_t r = (offset - h.rows_offset()) / row_bytes;
  const auto per_chunk = static_cast<uint64_t>(n_scored(h.n_ctx));
  return fmt::format("row {} of chunk {} (position {})", r % per_chunk, r / per_chunk,
                     static_cast<uint64_t>(first_scored(h.n_ctx)) + r % per_chunk);
}

}  // namespace

uint64_t Header::rows_offset() const {
  return kHeaderBytes + static_cast<uint64_t>(n_chunk) * static_cast<uint64_t>(n_ctx) * sizeof(int32_t);
}

uint64_t Header::row_offset(int64_t c, int64_t j) const {
  const auto row = static_cast<uint64_t>(c * n_scored(n_ctx) + j);
  return rows_offset() + row * static_cast<uint64_t>(row_values(n_vocab)) * sizeof(uint16_t);
}

double encode_row(std::span<const float> logits, int32_t token, std::span<uint16_t> row) {
  const size_t n = logits.size();
  KILN_ASSERT(n > 0 && row.size() == static_cast<size_t>(row_values(static_cast<int32_t>(n))));
  KILN_ASSERT(token >= 0 && static_cast<size_t>(token) < n);
  float max_logit = logits[0], min_logit = logits[0];
  for (const float x : logits) {
    max_logit = std::max(max_logit, x);
    min_logit = std::min(min_logit, x);
  }
  min_logit = std::max(min_logit, max_logit - kLogProbRange);
  double sum_exp = 0;  // each term in f32, summed in f64, in vocabulary order
  for (const float x : logits) sum_exp += std::exp(x - max_logit);
  const auto log_sum_exp = static_cast<float>(std::log(sum_exp));
  const float min_log_prob = min_logit - max_logit - log_sum_exp;
  const float scale = (max_logit - min_logit) / 65535.0f;
  std::memcpy(row.data(), &scale, sizeof(float));
  std::memcpy(row.data() + 2, &min_log_prob, sizeof(float));
  uint16_t* q = row.data() + 4;
  if (scale != 0) {
    const float inv_scale = 1.0f / scale;
    for (size_t i = 0; i < n; ++i) {
      // Round half to even, as the format's writer does; within [0, 65535] by construction.
      q[i] =
          logits[i] > min_logit ? static_cast<uint16_t>(std::lrint(inv_scale * (logits[i] - min_logit))) : 0;
    }
  } else {
    std::fill(q, q + n, uint16_t{0});
  }
  if (n % 2 != 0) q[n] = 0;
  return max_logit + log_sum_exp - logits[static_cast<size_t>(token)];
}

RowView view_row(std::span<const uint16_t> row) {
  KILN_ASSERT(row.size() >= 4);
  RowView v;
  std::memcpy(&v.scale, row.data(), sizeof(float));
  std::memcpy(&v.min_log_prob, row.data() + 2, sizeof(float));
  v.q = row.data() + 4;
  return v;
}

Reader::Reader(Reader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      header_(other.header_),
      tokens_(std::move(other.tokens_)) {}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

Result<Reader> Reader::open(const std::string& path) {
  Reader r;
  r.path_ = path;
  r.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_ < 0) {
    return make_status(errno == ENOENT ? StatusCode::not_found : StatusCode::io_error, "cannot open {}: {}",
                       path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(r.fd_, &st) != 0) return io_error("cannot stat {}: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return invalid_argument("{} is not a regular file", path);
  const auto size = static_cast<uint64_t>(st.st_size);
  char magic[sizeof(kMagic)] = {};
  if (size < sizeof(kMagic) || pread_all(r.fd_, magic, sizeof(magic), 0) != sizeof(magic) ||
      std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return invalid_argument("{} is not a KL-divergence base file: it does not start with \"_logits_\"", path);
  }
  if (size < kHeaderBytes) {
    return invalid_argument(
        "{} is truncated at offset {}: the header (n_ctx, n_vocab, n_chunk) ends at offset {}", path, size,
        kHeaderBytes);
  }
  uint32_t n_ctx = 0;
  int32_t counts[2] = {};
  if (pread_all(r.fd_, &n_ctx, sizeof(n_ctx), 8) != sizeof(n_ctx) ||
      pread_all(r.fd_, counts, sizeof(counts), 12) != sizeof(counts)) {
    return io_error("cannot read the header of {}: {}", path, std::strerror(errno));
  }
  const int32_t n_vocab = counts[0], n_chunk = counts[1];
  if (n_ctx < 3 || n_ctx > kMaxCount) {
    return invalid_argument("{}: n_ctx = {} (offset 8) is outside [3, {}]", path, n_ctx, kMaxCount);
  }
  if (n_vocab < 1 || n_vocab > kMaxCount) {
    return invalid_argument("{}: n_vocab = {} (offset 12) is outside [1, {}]", path, n_vocab, kMaxCount);
  }
  if (n_chunk < 1 || int64_t{n_chunk} * n_ctx > kMaxTokens) {
    return invalid_argument("{}: n_chunk = {} (offset 16) is outside [1, {}] for n_ctx = {}", path, n_chunk,
                            kMaxTokens / n_ctx, n_ctx);
  }
  r.header_ = Header{static_cast<int32_t>(n_ctx), n_vocab, n_chunk};
  const Header& h = r.header_;
  const uint64_t expected = h.file_bytes();
  if (size < expected) {
    return invalid_argument(
        "{} is truncated at offset {}, inside {}: n_ctx {}, n_vocab {} and n_chunk {} make the file {} bytes",
        path, size, place(h, size), h.n_ctx, h.n_vocab, h.n_chunk, expected);
  }
  if (size > expected) {
    return invalid_argument(
        "{} has {} bytes after its last row (from offset {}): n_ctx {}, n_vocab {} and n_chunk {} make the "
        "file "
        "{} bytes",
        path, size - expected, expected, h.n_ctx, h.n_vocab, h.n_chunk, expected);
  }
  r.tokens_.resize(static_cast<size_t>(h.n_chunk) * static_cast<size_t>(h.n_ctx));
  const size_t token_bytes = r.tokens_.size() * sizeof(int32_t);
  if (pread_all(r.fd_, r.tokens_.data(), token_bytes, kHeaderBytes) != static_cast<int64_t>(token_bytes)) {
    return io_error("cannot read the tokens of {} at offset {}: {}", path, kHeaderBytes,
                    std::strerror(errno));
  }
  for (size_t i = 0; i < r.tokens_.size(); ++i) {
    const int32_t t = r.tokens_[i];
    if (t < 0 || t >= h.n_vocab) {
      return invalid_argument("{}: token {} (chunk {}, offset {}) = {} is outside the vocabulary of {}", path,
                              i, i / static_cast<size_t>(h.n_ctx), kHeaderBytes + i * sizeof(int32_t), t,
                              h.n_vocab);
    }
  }
  return r;
}

std::span<const int32_t> Reader::chunk_tokens(int64_t c) const {
  KILN_ASSERT(c >= 0 && c < header_.n_chunk);
  const auto n = static_cast<size_t>(header_.n_ctx);
  return {tokens_.data() + static_cast<size_t>(c) * n, n};
}

Status Reader::read_row(int64_t c, int64_t j, std::span<uint16_t> row) const {
  KILN_ASSERT(c >= 0 && c < header_.n_chunk && j >= 0 && j < n_scored(header_.n_ctx));
  KILN_ASSERT(row.size() == static_cast<size_t>(row_values(header_.n_vocab)));
  const uint64_t offset = header_.row_offset(c, j);
  const int64_t got = pread_all(fd_, row.data(), row.size_bytes(), offset);
  if (got != static_cast<int64_t>(row.size_bytes())) {
    return io_error("cannot read row {} of chunk {} of {} at offset {}: {}", j, c, path_, offset,
                    got < 0 ? std::strerror(errno) : "the file ends there (was it cut short since?)");
  }
  return Status::ok_status();
}

Result<Writer> Writer::create(const std::string& path, const std::string& model, const Header& header,
                              std::span<const int32_t> tokens) {
  KILN_ASSERT(header.n_ctx >= 3 && header.n_vocab >= 1 && header.n_chunk >= 1);
  KILN_ASSERT(tokens.size() == static_cast<size_t>(header.n_chunk) * static_cast<size_t>(header.n_ctx));
  KILN_TRY(check_output_path(path));
  KILN_TRY(check_output_not_input(path, model));
  KILN_ASSIGN_OR_RETURN(OutputFile out, OutputFile::create(path));
  std::FILE* f = out.stream();
  const auto n_ctx = static_cast<uint32_t>(header.n_ctx);
  const bool ok = std::fwrite(kMagic, 1, sizeof(kMagic), f) == sizeof(kMagic) &&
                  std::fwrite(&n_ctx, sizeof(n_ctx), 1, f) == 1 &&
                  std::fwrite(&header.n_vocab, sizeof(int32_t), 1, f) == 1 &&
                  std::fwrite(&header.n_chunk, sizeof(int32_t), 1, f) == 1 &&
                  std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f) == tokens.size() &&
                  std::fflush(f) == 0;
  if (!ok) return io_error("cannot write the header of {}: {}", out.temp_path(), std::strerror(errno));
  return Writer(std::move(out), header);
}

Status Writer::write_row(int64_t c, int64_t j, std::span<const uint16_t> row) {
  KILN_ASSERT(c >= 0 && c < header_.n_chunk && j >= 0 && j < n_scored(header_.n_ctx));
  KILN_ASSERT(row.size() == static_cast<size_t>(row_values(header_.n_vocab)));
  const int fd = ::fileno(out_.stream());
  const uint64_t offset = header_.row_offset(c, j);
  const auto* p = reinterpret_cast<const char*>(row.data());
  size_t done = 0;
  while (done < row.size_bytes()) {
    const ssize_t w = ::pwrite(fd, p + done, row.size_bytes() - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return io_error("cannot write row {} of chunk {} to {} at offset {}: {}", j, c, out_.temp_path(),
                      offset, std::strerror(errno));
    }
    done += static_cast<size_t>(w);
  }
  ++rows_written_;
  return Status::ok_status();
}

Status Writer::commit() {
  const int64_t expected = int64_t{header_.n_chunk} * n_scored(header_.n_ctx);
  if (rows_written_ != expected) {
    return make_status(StatusCode::internal, "{}: {} rows written of {}", out_.temp_path(), rows_written_,
                       expected);
  }
  return out_.commit();
}

}  // namespace kiln::kld
