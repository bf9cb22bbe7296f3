// ops::Sample on CUDA: a block of kThreads per row, each row's token chosen on the device in a few passes
// over its logits (no sort of the vocabulary), by the stages of ops/sample.h.
//
// Every filter keeps a prefix of the order (a descending, ids ascending), so each stage is the search for one
// position of that order: top-k by count, top-p and the draw by cumulative weight. The order is the one of a
// 64-bit key (monotone bits of a << 32 | ~id). A search is a radix select: a pass puts the tokens of a key
// range into kBuckets equal key ranges (count and weight of each), one warp finds the bucket where the
// cumulative count or weight crosses the target, and the range narrows to it, until the tokens to look at fit
// in shared memory (kCap): they are gathered, sorted and scanned there. Where the whole kept prefix fits, it
// is gathered instead, and the stages after run on it with no further pass (top-k of up to kCap, or a top-p
// that keeps few tokens).
//
// Weights are summed in 64-bit fixed point (w * 2^64 split into a high and a low word, each summed in a u64),
// so sums are exact integers: the same bits whatever the order of the atomics, hence deterministic and
// batch-invariant; they stand within 2^-64 a token of the reference's f64 sums. The adjusted logits are made
// on the fly: a bitmap of the adjusted ids in shared memory (one bit test a token), the row's entries there
// too where they fit (else binary-searched in global memory). A row's mask of allowed tokens (constrained
// decoding) is copied into shared memory beside the bitmap (left in global memory past kMaskSharedMax) and
// read once per token a pass: a masked token is -inf before its adjustments are looked up. Rows without a
// mask never read it.
#include <cstdint>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_launch.cuh"
#include "ops/sample.h"

namespace kiln::cuda {

namespace {

using ops::SampleAdjust;
using ops::SampleRow;

constexpr int kThreads = 1024;
constexpr int kBuckets = 2048;           // a histogram round: 11 bits of the key range
constexpr int kCap = 2048;               // tokens sorted in shared memory
constexpr int kAdjCache = 256;           // a row's adjust entries held in shared memory
constexpr int kBitmapMax = 1 << 20;      // vocabularies up to this get the bitmap
constexpr int kMaskSharedMax = 1 << 19;  // and up to this a copy of a row's mask
constexpr uint64_t kNone = 0;            // no key (every real key is > 0: mono(-inf) is 0x007FFFFF)

__device__ inline uint32_t mono(float a) {
  const uint32_t b = __float_as_uint(a);
  return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}
__device__ inline float unmono(uint32_t m) {
  return __uint_as_float((m & 0x80000000u) != 0 ? m & 0x7FFFFFFFu : ~m);
}
__device__ inline uint64_t make_key(float a, int id) {
  return (uint64_t{mono(a)} << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
__device__ inline int key_id(uint64_t k) { return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(k)); }
__device__ inline float key_value(uint64_t k) { return unmono(static_cast<uint32_t>(k >> 32)); }

// Stage 6's weight, as the reference computes it (no contraction).
__device__ inline float weight(float a, float a_max, float t) {
  return expf(__fdiv_rn(__fsub_rn(a, a_max), t));
}

// A weight in fixed point: w = hi * 2^-32 + lo * 2^-64 (w <= 1: hi <= 2^32, lo < 2^32), exact for w >= 2^-40.
struct Fx {
  uint64_t hi, lo;
};
__device__ inline Fx fx_of(float w) {
  const double d = static_cast<double>(w) * 0x1p32, h = floor(d);
  return {static_cast<uint64_t>(h), static_cast<uint64_t>((d - h) * 0x1p32)};
}
__device__ inline double fx_value(uint64_t hi, uint64_t lo) {
  return static_cast<double>(hi) * 0x1p-32 + static_cast<double>(lo) * 0x1p-64;
}

// What a search looks for: the first position whose cumulative count reaches the target (top-k), or whose
// cumulative weight reaches it (top-p) or passes it (the draw).
enum class Goal { count, at_least, above };
__device__ inline bool crosses(Goal g, uint32_t c, uint64_t hi, uint64_t lo, double target) {
  if (g == Goal::count) return static_cast<double>(c) >= target;
  const double v = fx_value(hi, lo);
  return g == Goal::at_least ? v >= target : v > target;
}

// Stage 2 for one entry, with the reference's roundings.
__device__ inline float adjusted(float x, const SampleRow& p, const SampleAdjust& e) {
  float a = __fadd_rn(x, e.bias);
  if (e.count > 0) {
    if (p.repeat_penalty != 1.0f)
      a = a > 0.0f ? __fdiv_rn(a, p.repeat_penalty) : __fmul_rn(a, p.repeat_penalty);
    a = __fsub_rn(a,
                  __fadd_rn(__fmul_rn(p.frequency_penalty, static_cast<float>(e.count)), p.presence_penalty));
  }
  return e.banned != 0 ? -INFINITY : a;
}

// What the block shares besides the dynamic buffers.
struct Shared {
  int32_t p[16];  // the row's SampleRow
  uint64_t u64[32];
  double f64[32];
  int i32[32];
  uint32_t n_list;
  int bucket;  // the bucket a scan found, and the sums of those before it (including the range's base)
  uint32_t c_before;
  uint64_t hi_before, lo_before;
  int idx;
};

// One row's view: its logits, its parameters and adjust entries, and the block's buffers.
struct Row {
  const float* x;
  int n;
  const SampleRow* p;
  const uint32_t* bits;     // the bitmap of adjusted ids; null: look every token up
  const SampleAdjust* adj;  // the row's entries (shared or global memory)
  int n_adj;
  const uint32_t* mask;  // [ceil(n / 32)] the row's allowed tokens (shared or global memory); null: all
  uint32_t* cnt;         // [kBuckets] histogram: counts,
  unsigned long long *hi, *lo;  // weights
  uint64_t* list;               // [kCap] gathered keys (over the histogram)
  Shared* s;

  __device__ float a_at(int i, float v) const {
    if (mask != nullptr && !ops::sample_mask_allows(mask, i)) return -INFINITY;
    if (n_adj == 0) return v;
    if (bits != nullptr && ((bits[i >> 5] >> (i & 31)) & 1u) == 0) return v;
    int lo_i = 0, hi_i = n_adj;
    while (lo_i < hi_i) {
      const int mid = (lo_i + hi_i) / 2;
      if (adj[mid].id < i)
        lo_i = mid + 1;
      else
        hi_i = mid;
    }
    return lo_i < n_adj && adj[lo_i].id == i ? adjusted(v, *p, adj[lo_i]) : v;
  }
  // Token i's key (raw logits or adjusted), kNone for an adjusted -inf.
  __device__ uint64_t key_at(int i, bool raw) const {
    const float v = x[i];
    if (raw) return make_key(v, i);
    const float a = a_at(i, v);
    return a == -INFINITY ? kNone : make_key(a, i);
  }
};

template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* red) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < kThreads / 32; ++w) v = op(v, red[w]);
  return v;
}
struct Max {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};
struct Min {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a < b ? a : b;
  }
};
struct Add {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Sorts list[0, n) descending (bitonic, padded with kNone to a power of two).
__device__ void sort_list(uint64_t* list, uint32_t n) {
  uint32_t m = 1;
  while (m < n) m *= 2;
  for (uint32_t i = n + threadIdx.x; i < m; i += kThreads) list[i] = kNone;
  __syncthreads();
  for (uint32_t k = 2; k <= m; k *= 2) {
    for (uint32_t j = k / 2; j > 0; j /= 2) {
      for (uint32_t i = threadIdx.x; i < m; i += kThreads) {
        const uint32_t l = i ^ j;
        if (l > i) {
          const uint64_t a = list[i], b = list[l];
          if (((i & k) == 0) == (a < b)) list[i] = b, list[l] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Gathers the keys in [lo, hi] (at most kCap of them) into list, sorted; returns how many.
__device__ uint32_t gather(const Row& r, bool raw, uint64_t lo, uint64_t hi) {
  if (threadIdx.x == 0) r.s->n_list = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < r.n; i += kThreads) {
    const uint64_t k = r.key_at(i, raw);
    if (k != kNone && k >= lo && k <= hi) {
      const uint32_t at = atomicAdd(&r.s->n_list, 1u);
      if (at < kCap) r.list[at] = k;
    }
  }
  __syncthreads();
  const uint32_t n = min(r.s->n_list, static_cast<uint32_t>(kCap));
  sort_list(r.list, n);
  return n;
}

// In warp 0: the first of `n` items (item j: count c(j), weight w(j)) where base + the sums up to it cross
// the target; else (a weight total short of it by rounding) the last item with a count. Leaves in s the item
// and the sums before it, base included. Each lane takes a contiguous run of items.
template <class Item>
__device__ void find_crossing(Shared* s, int n, Goal g, double target, uint32_t c0, uint64_t hi0,
                              uint64_t lo0, Item item) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x, per = (n + 31) / 32, b = min(n, lane * per), e = min(n, b + per);
  uint32_t c = 0;
  uint64_t hi = 0, lo = 0;
  for (int j = b; j < e; ++j) {
    uint32_t cj;
    Fx w;
    item(j, cj, w);
    c += cj, hi += w.hi, lo += w.lo;
  }
  uint32_t ci = c;
  uint64_t hii = hi, loi = lo;
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t cu = __shfl_up_sync(0xffffffffu, ci, o);
    const uint64_t hu = __shfl_up_sync(0xffffffffu, hii, o), lu = __shfl_up_sync(0xffffffffu, loi, o);
    if (lane >= o) ci += cu, hii += hu, loi += lu;
  }
  const unsigned hit = __ballot_sync(0xffffffffu, c > 0 && crosses(g, c0 + ci, hi0 + hii, lo0 + loi, target));
  const unsigned any = __ballot_sync(0xffffffffu, c > 0);
  const bool fallback = hit == 0;
  const int who = fallback ? 31 - __clz(static_cast<int>(any)) : __ffs(static_cast<int>(hit)) - 1;
  if (lane != who) return;
  c = c0 + ci - c, hi = hi0 + hii - hi, lo = lo0 + loi - lo;  // the sums before this lane's run
  int found = -1;
  uint32_t fc = 0;
  uint64_t fh = 0, fl = 0;
  for (int j = b; j < e; ++j) {
    uint32_t cj;
    Fx w;
    item(j, cj, w);
    if (cj == 0) continue;
    found = j, fc = c, fh = hi, fl = lo;
    if (!fallback && crosses(g, c + cj, hi + w.hi, lo + w.lo, target)) break;
    c += cj, hi += w.hi, lo += w.lo;
  }
  c = fc, hi = fh, lo = fl;
  s->idx = found;
  s->c_before = c, s->hi_before = hi, s->lo_before = lo;
}

// The item at list[j] (a key) for find_crossing: count 1 and its weight.
struct ListItem {
  const uint64_t* list;
  float a_max, t;
  bool want_w;
  __device__ void operator()(int j, uint32_t& c, Fx& w) const {
    c = 1;
    w = want_w ? fx_of(weight(key_value(list[j]), a_max, t)) : Fx{0, 0};
  }
};
struct BucketItem {
  const uint32_t* cnt;
  const unsigned long long *hi, *lo;
  __device__ void operator()(int j, uint32_t& c, Fx& w) const { c = cnt[j], w = {hi[j], lo[j]}; }
};

// The result of a search: the key found, its index in the list, and whether the list holds the sorted kept
// prefix from the range's top key down to at least that one (else only the keys of the last bucket).
struct Found {
  uint64_t key;
  bool prefix;
  int idx;  // where the key is in the list
};

// The search of `g` over the keys in [lo, top] (raw or adjusted), the kept range: for Goal::count the
// target-th key; for the weights the target is `factor` times the range's total weight. Want_prefix: gather
// the whole range down to the crossing when it fits in kCap.
__device__ Found search(const Row& r, bool raw, uint64_t lo, uint64_t top, Goal g, double factor, float a_max,
                        float t, bool want_prefix) {
  Shared* s = r.s;
  const bool want_w = g != Goal::count;
  double target = g == Goal::count ? factor : 0.0;
  uint64_t hi = top;
  uint32_t c0 = 0;  // the sums above [lo, hi]
  uint64_t hi0 = 0, lo0 = 0;
  for (bool first = true;; first = false) {
    int shift = 0;
    while (((hi - lo) >> shift) >= static_cast<uint64_t>(kBuckets)) ++shift;
    __syncthreads();  // every thread done with the list (the histogram's memory) before it is cleared
    for (int b = threadIdx.x; b < kBuckets; b += kThreads) r.cnt[b] = 0, r.hi[b] = 0, r.lo[b] = 0;
    __syncthreads();
    for (int base = 0; base < r.n; base += kThreads) {  // every lane of a warp takes each round
      const int i = base + static_cast<int>(threadIdx.x);
      int b = -1;
      Fx w{0, 0};
      if (i < r.n) {
        const uint64_t k = r.key_at(i, raw);
        if (k != kNone && k >= lo && k <= hi) {
          b = static_cast<int>((hi - k) >> shift);
          if (want_w) w = fx_of(weight(key_value(k), a_max, t));
        }
      }
      // A row's tokens crowd into few buckets: the lanes of one bucket add up in the warp first, and one
      // atomic per bucket and warp goes out instead of one per token queueing on the same address.
      const unsigned peers = __match_any_sync(0xffffffffu, b);
      uint64_t sh = 0, sl = 0;
      if (want_w) {
        for (int src = 0; src < 32; ++src) {
          const uint64_t h = __shfl_sync(0xffffffffu, w.hi, src), l = __shfl_sync(0xffffffffu, w.lo, src);
          if ((peers >> src) & 1u) sh += h, sl += l;
        }
      }
      if (b >= 0 && static_cast<int>(threadIdx.x % 32) == __ffs(static_cast<int>(peers)) - 1) {
        atomicAdd(r.cnt + b, static_cast<unsigned>(__popc(peers)));
        if (want_w) {
          atomicAdd(r.hi + b, static_cast<unsigned long long>(sh));
          atomicAdd(r.lo + b, static_cast<unsigned long long>(sl));
        }
      }
    }
    __syncthreads();
    if (first && want_w) {  // the range's total weight, summed in a fixed order
      uint64_t th = 0, tl = 0;
      for (int b = threadIdx.x; b < kBuckets; b += kThreads) th += r.hi[b], tl += r.lo[b];
      th = block_reduce<uint64_t>(th, Add{}, s->u64);
      tl = block_reduce<uint64_t>(tl, Add{}, s->u64);
      target = factor * fx_value(th, tl);
    }
    find_crossing(s, kBuckets, g, target, c0, hi0, lo0, BucketItem{r.cnt, r.hi, r.lo});
    __syncthreads();
    const int b = s->idx;
    const uint64_t b_hi = hi - (static_cast<uint64_t>(b) << shift);
    const uint64_t b_lo = b_hi - lo < (uint64_t{1} << shift) - 1 ? lo : b_hi - ((uint64_t{1} << shift) - 1);
    const uint32_t n_b = r.cnt[b], c_before = s->c_before;
    const uint64_t hib = s->hi_before, lob = s->lo_before;
    __syncthreads();  // the list overwrites the histogram
    if (want_prefix && c_before + n_b <= kCap) {
      const uint32_t n = gather(r, raw, b_lo, top);
      find_crossing(s, static_cast<int>(n), g, target, 0, 0, 0, ListItem{r.list, a_max, t, want_w});
      __syncthreads();
      return {r.list[s->idx], true, s->idx};
    }
    if (n_b <= kCap || b_lo == b_hi) {
      const uint32_t n = gather(r, raw, b_lo, b_hi);
      find_crossing(s, static_cast<int>(n), g, target, c_before, hib, lob,
                    ListItem{r.list, a_max, t, want_w});
      __syncthreads();
      return {r.list[s->idx], false, s->idx};
    }
    lo = b_lo, hi = b_hi, c0 = c_before, hi0 = hib, lo0 = lob;
  }
}

// The weight of the first n keys of the list (the kept prefix), summed in fixed point: exact in any order.
__device__ double list_weight(const Row& r, uint32_t n, float a_max, float t) {
  uint64_t th = 0, tl = 0;
  for (uint32_t j = threadIdx.x; j < n; j += kThreads) {
    const Fx w = fx_of(weight(key_value(r.list[j]), a_max, t));
    th += w.hi, tl += w.lo;
  }
  th = block_reduce<uint64_t>(th, Add{}, r.s->u64);
  tl = block_reduce<uint64_t>(tl, Add{}, r.s->u64);
  return fx_value(th, tl);
}

// The block's sum of f over the row's tokens, in f64 (a fixed order: per thread, then the block).
template <class F>
__device__ double row_sum(const Row& r, F f) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < r.n; i += kThreads) acc += f(i);
  return block_reduce<double>(acc, Add{}, r.s->f64);
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(Rows xs, const SampleRow* rows, const SampleAdjust* adjust, const uint32_t* masks,
                  int mask_words, int n_masks, bool mask_shared, int32_t* out, int out_stride, int n,
                  int bitmap_words) {
  pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Shared s;
  const int64_t row = blockIdx.x;
  if (threadIdx.x < 16) s.p[threadIdx.x] = reinterpret_cast<const int32_t*>(rows + row)[threadIdx.x];
  __syncthreads();
  const SampleRow& p = *reinterpret_cast<const SampleRow*>(s.p);
  auto* hist = reinterpret_cast<unsigned long long*>(smem);  // hi, lo, then counts; the list over them
  auto* cache = reinterpret_cast<SampleAdjust*>(smem + kBuckets * 20);
  auto* bits = reinterpret_cast<uint32_t*>(cache + kAdjCache);
  uint32_t* mask_copy = bits + bitmap_words;  // [mask_words] under mask_shared
  Row r{xs.row_as<const float>(row),
        n,
        &p,
        nullptr,
        adjust + p.adjust_begin,
        p.adjust_count,
        masks != nullptr && p.mask_row >= 0 && p.mask_row < n_masks
            ? masks + static_cast<int64_t>(mask_words) * p.mask_row
            : nullptr,
        reinterpret_cast<uint32_t*>(hist + 2 * kBuckets),
        hist,
        hist + kBuckets,
        reinterpret_cast<uint64_t*>(smem),
        &s};
  if (r.n_adj > 0) {
    if (r.n_adj <= kAdjCache) {
      for (int j = threadIdx.x; j < r.n_adj; j += kThreads) cache[j] = r.adj[j];
      r.adj = cache;
    }
    if (bitmap_words > 0) {
      for (int w = threadIdx.x; w < bitmap_words; w += kThreads) bits[w] = 0;
      __syncthreads();
      for (int j = threadIdx.x; j < r.n_adj; j += kThreads) {
        const int id = adjust[p.adjust_begin + j].id;
        if (id >= 0 && id < n) atomicOr(bits + (id >> 5), 1u << (id & 31));
      }
      r.bits = bits;
    }
    __syncthreads();
  }
  if (r.mask != nullptr && mask_shared) {
    for (int w = threadIdx.x; w < mask_words; w += kThreads) mask_copy[w] = r.mask[w];
    r.mask = mask_copy;
    __syncthreads();
  }
  // Pass 1 (stages 1-2): bad logits, the raw and adjusted extremes, the candidates.
  bool bad = false, bad_a = false;
  uint64_t x_top = kNone, x_bottom = ~uint64_t{0}, a_top = kNone, a_bottom = ~uint64_t{0};
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = r.x[i];
    bad |= !(v < INFINITY);
    const uint64_t xk = make_key(v, i);
    x_top = max(x_top, xk), x_bottom = min(x_bottom, xk);
    const float a = r.a_at(i, v);
    bad_a |= !(a < INFINITY);
    if (a != -INFINITY) {
      const uint64_t k = make_key(a, i);
      a_top = max(a_top, k), a_bottom = min(a_bottom, k);
    }
  }
  bad = __syncthreads_or(bad) != 0;
  bad_a = __syncthreads_or(bad_a) != 0;
  x_top = block_reduce<uint64_t>(x_top, Max{}, s.u64);
  x_bottom = block_reduce<uint64_t>(x_bottom, Min{}, s.u64);
  a_top = block_reduce<uint64_t>(a_top, Max{}, s.u64);
  a_bottom = block_reduce<uint64_t>(a_bottom, Min{}, s.u64);
  int32_t* o = out + row * out_stride;
  const float x_max = key_value(x_top);
  const int32_t err = bad || x_max == -INFINITY ? ops::kSampleBadLogits
                      : bad_a                   ? ops::kSampleBadAdjusted
                      : a_top == kNone          ? ops::kSampleAllMasked
                                                : 0;
  if (err != 0) {
    if (threadIdx.x == 0) o[0] = err, o[1] = 0;
    return;
  }
  int32_t token = key_id(a_top);
  if (p.temperature != 0.0f) {
    // Stages 5-8 on the kept range [keep, a_top]. Once the kept prefix is in the list (sorted), the stages
    // after run on it: n_kept of its entries.
    const float a_max = key_value(a_top), t = p.temperature;
    uint64_t keep = a_bottom;
    bool listed = false;
    uint32_t n_kept = 0;
    const ListItem items{r.list, a_max, t, true};
    if (p.top_k > 0) {
      const Found f = search(r, false, keep, a_top, Goal::count, p.top_k, a_max, t, true);
      keep = f.key;  // top_k past the candidates: the last one
      listed = f.prefix;
      n_kept = f.idx + 1;
      if (!listed && p.top_k <= kCap) listed = true, n_kept = gather(r, false, keep, a_top);
    }
    if (p.top_p < 1.0f) {
      if (listed) {
        find_crossing(&s, static_cast<int>(n_kept), Goal::at_least,
                      static_cast<double>(p.top_p) * list_weight(r, n_kept, a_max, t), 0, 0, 0, items);
        __syncthreads();
        n_kept = s.idx + 1;
      } else {
        const Found f = search(r, false, keep, a_top, Goal::at_least, p.top_p, a_max, t, true);
        keep = f.key;
        listed = f.prefix;
        n_kept = f.idx + 1;
      }
    }
    if (p.min_p > 0.0f) {
      // The first kept token (in order) below min_p ends the kept prefix.
      if (listed) {
        int first = static_cast<int>(n_kept);
        for (uint32_t j = threadIdx.x; j < n_kept; j += kThreads) {
          if (weight(key_value(r.list[j]), a_max, t) < p.min_p) first = min(first, static_cast<int>(j));
        }
        n_kept = max(block_reduce<int>(first, Min{}, s.i32), 1);  // the best token's weight is 1
      } else {
        uint64_t cut = kNone;
        for (int i = threadIdx.x; i < n; i += kThreads) {
          const uint64_t k = r.key_at(i, false);
          if (k != kNone && k >= keep && weight(key_value(k), a_max, t) < p.min_p) cut = max(cut, k);
        }
        cut = block_reduce<uint64_t>(cut, Max{}, s.u64);
        if (cut != kNone) keep = cut + 1;
      }
    }
    const double u = ops::sample_uniform(uint64_t{p.seed_hi} << 32 | p.seed_lo, p.counter);
    if (listed) {
      find_crossing(&s, static_cast<int>(n_kept), Goal::above, u * list_weight(r, n_kept, a_max, t), 0, 0, 0,
                    items);
      __syncthreads();
      token = key_id(r.list[s.idx]);
    } else {
      token = key_id(search(r, false, keep, a_top, Goal::above, u, a_max, t, false).key);
    }
  }
  __syncthreads();
  if (p.logprobs == 0 && p.n_top <= 0) {
    if (threadIdx.x == 0) o[0] = token, o[1] = 0;
    return;
  }
  // Stage 9 on the raw logits.
  const double lse = static_cast<double>(x_max) +
                     log(row_sum(r, [&](int i) { return static_cast<double>(expf(r.x[i] - x_max)); }));
  const int n_top = min(min(max(p.n_top, 0), ops::kSampleMaxTop), min(n, (out_stride - 2) / 2));
  if (n_top > 0) {
    const Found f = search(r, true, x_bottom, x_top, Goal::count, n_top, 0.0f, 1.0f, true);
    if (!f.prefix) gather(r, true, f.key, x_top);
  }
  if (threadIdx.x == 0) {
    o[0] = token;
    o[1] = __float_as_int(static_cast<float>(static_cast<double>(r.x[token]) - lse));
  }
  if (threadIdx.x < n_top) {
    const int id = key_id(r.list[threadIdx.x]);
    o[2 + 2 * threadIdx.x] = id;
    o[3 + 2 * threadIdx.x] = __float_as_int(static_cast<float>(static_cast<double>(r.x[id]) - lse));
  }
}

}  // namespace

cudaError_t sample(const Context& ctx, const ops::Sample& op) {
  const int64_t n = op.x.ne[0], rows = op.x.n_rows();
  if (rows == 0) return cudaSuccess;
  const int bitmap_words = n <= kBitmapMax ? static_cast<int>((n + 31) / 32) : 0;
  const bool masked = ops::sample_op_has_mask(op), mask_shared = masked && n <= kMaskSharedMax;
  // The adjusted ids' bitmap, then room for a row's mask (as many words).
  const size_t smem = kBuckets * 20 + kAdjCache * sizeof(SampleAdjust) +
                      4 * static_cast<size_t>(bitmap_words) * (mask_shared ? 2 : 1);
  if (const cudaError_t e = allow_dynamic_shared(reinterpret_cast<const void*>(sample_kernel), smem);
      e != cudaSuccess) {
    return e;
  }
  (void)launch_kernel(
      ctx, sample_kernel, static_cast<unsigned>(rows), kThreads, smem, rows_of(op.x),
      static_cast<const SampleRow*>(op.rows.data), static_cast<const SampleAdjust*>(op.adjust.data),
      masked ? static_cast<const uint32_t*>(op.mask.data) : nullptr, static_cast<int>(op.mask.ne[0]),
      masked ? static_cast<int>(op.mask.n_rows()) : 0, mask_shared, static_cast<int32_t*>(op.out.data),
      static_cast<int>(op.out.ne[0]), static_cast<int>(n), bitmap_words);
  return cudaGetLastError();
}

}  // namespace kiln::cuda
