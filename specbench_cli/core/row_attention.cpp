// Attention one query row at a time, each row over the keys its mask shows, in slot order (specbench_cli/core/row_attention.py).
//
// Every (sequence, query head, row) is computed by the same code, one thread, over the sequence of keys its mask
// row shows: its scores, softmax and weighted sum depend on those keys' values and order only, not on the slots
// they sit at, the number of rows in the call, the row's neighbours or the thread count. So a verify row and the
// one-token decode at the same position, which see the same keys in the same order, get the same bits.
//
// Registered as torch.ops.specbench.row_attention(q [B, H, R, d], k [B, KVH, S, d], v [B, KVH, S, d],
// mask bool [B, R, S], scale) -> [B, R, H, d] in q's dtype; float32 arithmetic throughout.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "row_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using specbench::Floats;
using specbench::kLanes;
using specbench::widen;

constexpr int64_t kRows = 4;  // rows of one sequence and head attended together (they share each key's load)

typedef float Floats8 __attribute__((vector_size(8 * sizeof(float))));
typedef float Floats4 __attribute__((vector_size(4 * sizeof(float))));

// the sum of x's lanes, halves added pairwise (a fixed order)
inline float lanes_sum(Floats x) {
  const Floats8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
                    __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  const Floats4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// softmax in place over a row's n scores (n > 0): exp(score - max), kLanes at a time (the last few in a vector of
// their own), summed in kLanes partial sums added in a fixed order; returns the sum
inline float softmax_numerators(float* scores, int64_t n) {
  float top = scores[0];
  for (int64_t j = 1; j < n; ++j) top = std::max(top, scores[j]);
  Floats partial = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    Floats x;
    std::memcpy(&x, scores + j, sizeof(x));
    x = specbench::exp_clamped(x - top);
    std::memcpy(scores + j, &x, sizeof(x));
    partial += x;
  }
  if (j < n) {
    const Floats x = specbench::exp_clamped(specbench::widen_first(scores + j, n - j) - top);
    for (int64_t l = 0; j < n; ++j, ++l) {
      scores[j] = x[l];
      partial[l] += x[l];
    }
  }
  return lanes_sum(partial);
}

// q . k over V vectors, lane by lane (its lanes summed by the caller): the one expression every score comes from
template <int64_t V>
inline Floats dot(const Floats* q, const Floats* k) {
  Floats acc = q[0] * k[0];
  for (int64_t c = 1; c < V; ++c) acc += q[c] * k[c];
  return acc;
}

// acc += p * v over V vectors: the one expression every weighted value goes through
template <int64_t V>
inline void accumulate(Floats* acc, float p, const Floats* v) {
  const Floats weight = Floats{} + p;
  for (int64_t c = 0; c < V; ++c) acc[c] += weight * v[c];
}

// lane j: lanes_sum(x[j]) for 16 vectors at once, by the same additions in the same order (lane l + lane l + 8,
// then + 4, then (0 + 2) + (1 + 3)), so a score is the same bits whichever way it was summed
inline Floats lanes_sums(const Floats* x) {
  Floats a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)  // keys 2i, 2i+1: lanes 0-7 and 8-15 hold each one's lane l + lane l + 8
    a[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)  // keys 4i..4i+3: four lanes each, b_l = a_l + a_(l+4)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // keys 8i..8i+7: two lanes each, b_0 + b_2 and b_1 + b_3
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// whether every one of `rows` mask rows shows all kLanes slots from s
inline bool all_seen(const bool* const* masks, int64_t rows, int64_t mask_stride, int64_t s) {
  for (int64_t r = 0; r < rows; ++r) {
    const bool* m = masks[r] + s * mask_stride;
    if (mask_stride == 1) {
      uint64_t w[2];
      std::memcpy(w, m, sizeof(w));
      if ((w[0] & w[1]) != 0x0101010101010101ull) return false;
    } else {
      for (int64_t l = 0; l < kLanes; ++l)
        if (!m[l * mask_stride]) return false;
    }
  }
  return true;
}

// Up to kRows rows of one sequence and query head: softmax(q . k * scale) @ v over the keys each row's mask shows,
// in slot order, into its dst. The rows share each key's and value's load; each row's arithmetic is the same
// sequence of operations whichever rows are beside it. `scores[r]` has room for `span` floats; D (the head dim) is
// a multiple of kLanes. Slots come kLanes at a time: where every row sees all of them (a verify's prefix, all of a
// decode's keys but the last few) without a look at each slot, else slot by slot; a score and a weighted value are
// the same bits either way (`dot`, `lanes_sums`, `accumulate`), so a row's result never depends on which way its
// keys went.
template <typename T, int64_t D>
inline void attend_rows(int64_t rows, const T* const* queries, const bool* const* masks, int64_t mask_stride,
                        int64_t span, const T* keys, const T* values, int64_t key_stride, int64_t value_stride,
                        float factor, float* const* scores, T* const* dsts) {
  constexpr int64_t V = D / kLanes;
  Floats q[kRows][V];
  int64_t n[kRows] = {};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < V; ++c) q[r][c] = widen(queries[r] + c * kLanes);
  // the slots in [from, to) some row sees, in slot order: its key (or value) as floats, visited for each row that
  // sees it
  const auto each_seen = [&](const T* base, int64_t stride, int64_t from, int64_t to, auto&& visit) {
    bool sees[kRows];
    for (int64_t s = from; s < to; ++s) {
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) any |= (sees[r] = masks[r][s * mask_stride]);
      if (!any) continue;
      Floats x[V];
      for (int64_t c = 0; c < V; ++c) x[c] = widen(base + s * stride + c * kLanes);
      for (int64_t r = 0; r < rows; ++r)
        if (sees[r]) visit(r, x);
    }
  };
  const auto score = [&](int64_t r, const Floats* k) { scores[r][n[r]++] = lanes_sum(dot<V>(q[r], k)) * factor; };
  for (int64_t s = 0; s < span; s += kLanes) {
    if (s + kLanes > span || !all_seen(masks, rows, mask_stride, s)) {
      each_seen(keys, key_stride, s, std::min(s + kLanes, span), score);
      continue;
    }
    Floats sums[kRows][kLanes];
    for (int64_t l = 0; l < kLanes; ++l) {
      Floats k[V];
      for (int64_t c = 0; c < V; ++c) k[c] = widen(keys + (s + l) * key_stride + c * kLanes);
      for (int64_t r = 0; r < rows; ++r) sums[r][l] = dot<V>(q[r], k);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const Floats x = lanes_sums(sums[r]) * factor;
      std::memcpy(scores[r] + n[r], &x, sizeof(x));
      n[r] += kLanes;
    }
  }
  float total[kRows];
  for (int64_t r = 0; r < rows; ++r) total[r] = n[r] ? softmax_numerators(scores[r], n[r]) : 0.0f;
  Floats acc[kRows][V] = {};
  int64_t j[kRows] = {};
  const auto weigh = [&](int64_t r, const Floats* v) { accumulate<V>(acc[r], scores[r][j[r]++], v); };
  for (int64_t s = 0; s < span; s += kLanes) {
    if (s + kLanes > span || !all_seen(masks, rows, mask_stride, s)) {
      each_seen(values, value_stride, s, std::min(s + kLanes, span), weigh);
      continue;
    }
    for (int64_t l = 0; l < kLanes; ++l) {
      Floats v[V];
      for (int64_t c = 0; c < V; ++c) v[c] = widen(values + (s + l) * value_stride + c * kLanes);
      for (int64_t r = 0; r < rows; ++r) weigh(r, v);
    }
  }
  for (int64_t r = 0; r < rows; ++r)  // a row that sees nothing (padding nobody reads) gets zeros
    for (int64_t c = 0; c < V; ++c)
      for (int64_t l = 0; l < kLanes; ++l)
        dsts[r][c * kLanes + l] = static_cast<T>(n[r] ? acc[r][c][l] / total[r] : 0.0f);
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale,
            at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), D = q.size(3);
  const int64_t KVH = k.size(1), S = mask.size(2);  // keys a row may see: the mask's span
  const int64_t group = H / KVH, blocks = (R + kRows - 1) / kRows;
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const bool* mp = mask.data_ptr<bool>();
  T* op = out.data_ptr<T>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), ms = mask.strides(), os = out.strides();
  const float factor = static_cast<float>(scale);
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(kRows * S);
    float* scores[kRows];
    for (int64_t r = 0; r < kRows; ++r) scores[r] = buffer.data() + r * S;
    for (int64_t item = begin; item < end; ++item) {  // (sequence, query head, block of kRows rows)
      const int64_t first = item % blocks * kRows, h = item / blocks % H, b = item / (blocks * H), kh = h / group;
      const int64_t rows = std::min(kRows, R - first);
      const T* queries[kRows];
      const bool* masks[kRows];
      T* dsts[kRows];
      for (int64_t r = 0; r < rows; ++r) {
        queries[r] = qp + b * qs[0] + h * qs[1] + (first + r) * qs[2];
        masks[r] = mp + b * ms[0] + (first + r) * ms[1];
        dsts[r] = op + b * os[0] + (first + r) * os[1] + h * os[2];
      }
      const T* keys = kp + b * ks[0] + kh * ks[1];
      const T* values = vp + b * vs[0] + kh * vs[1];
      switch (D / kLanes) {
#define SPECBENCH_HEAD_DIM(v)                                                                                   \
  case v:                                                                                                       \
    attend_rows<T, v * kLanes>(rows, queries, masks, ms[2], S, keys, values, ks[2], vs[2], factor, scores, dsts); \
    break;
        SPECBENCH_HEAD_DIM(1) SPECBENCH_HEAD_DIM(2) SPECBENCH_HEAD_DIM(3) SPECBENCH_HEAD_DIM(4)
        SPECBENCH_HEAD_DIM(5) SPECBENCH_HEAD_DIM(6) SPECBENCH_HEAD_DIM(7) SPECBENCH_HEAD_DIM(8)
        SPECBENCH_HEAD_DIM(10) SPECBENCH_HEAD_DIM(12) SPECBENCH_HEAD_DIM(16)
#undef SPECBENCH_HEAD_DIM
      }
    }
  });
}

bool supported_head_dim(int64_t d) {
  const int64_t v = d / kLanes;
  return d % kLanes == 0 && ((v >= 1 && v <= 8) || v == 10 || v == 12 || v == 16);
}

}  // namespace

at::Tensor specbench::row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 3, "row_attention: q, k, v 4-d, mask 3-d");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "row_attention: one dtype");
  TORCH_CHECK(mask.scalar_type() == at::kBool, "row_attention: a bool mask");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "row_attention: query heads a multiple of kv heads");
  TORCH_CHECK(supported_head_dim(q.size(3)), "row_attention: head dim 16 to 128 in steps of 16, 160, 192 or 256");
  TORCH_CHECK(mask.size(0) == q.size(0) && mask.size(1) == q.size(2) && mask.size(2) <= k.size(2),
              "row_attention: mask [B, R, S <= keys]");
  // innermost dimension contiguous (the cache's head_dim is); anything else is copied
  const at::Tensor qc = q.stride(3) == 1 ? q : q.contiguous();
  const at::Tensor kc = k.stride(3) == 1 ? k : k.contiguous();
  const at::Tensor vc = v.stride(3) == 1 ? v : v.contiguous();
  at::Tensor out = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "row_attention", [&] {
    attend<scalar_t>(qc, kc, vc, mask, scale, out);
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("row_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specbench, CPU, m) { m.impl("row_attention", &specbench::row_attention); }
