// The decoder layers of a pre-norm rotary model (Llama, Qwen2, Qwen3, Mistral) over some rows, in one call
// (specbench_cli/core/decoder_layers.py).
//
// Why: a CPU decode of the embedded model spent less than two thirds of its time in its GEMMs; the rest was ~1,500
// small PyTorch operators (norms, rotary, cache writes, casts, the MLP's activation, residual adds) and the Python
// between them. Here each layer is its GEMMs (oneDNN's linear on the target's packed weights, the call the Python
// forward makes), the row attention kernel, and loops of ours for everything between, each over one row at a
// time: a row's bits depend only on that row, never on how many rows the call has, so a verify row and the
// one-token decode at its position stay bit-identical as long as the GEMMs keep them so (the caller pads a one-row
// GEMM to two where the probed kernel needs it).
//
// Each step rounds to the model's dtype where Hugging Face's eager modules do (RMSNorm: float32 over the row, the
// normalised row rounded, then times the weight; rotary: q*cos and rotate(q)*sin rounded, then their sum; the MLP:
// silu(gate) rounded, then times up; residual adds), so outputs differ from theirs only where a float32 sum's order
// or exp's last bits round a value the other way.
//
// torch.ops.specbench.decoder_layers(h [T, H], weights, extras, cos [T, d], sin [T, d], kv, mask [B, R, S],
// place [T], slots [T], heads, kv_heads, eps, scale, pad, capture) -> (h [T, H], captured)

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "row_kernels.h"

namespace {

using specbench::Floats;
using specbench::kLanes;
using specbench::narrow;
using specbench::rounded;
using specbench::widen;

constexpr int64_t kWeights = 6;     // per layer: input norm, q/k/v (stacked, packed), o, post norm, gate/up, down
constexpr int64_t kExtras = 6;      // per layer: the four GEMMs' biases, q norm, k norm (each may be None)
enum Gemm : int64_t { kQKV = 0, kOut = 1, kGateUp = 2, kDown = 3 };

// oneDNN's linear over a weight `mkldnn::_reorder_linear_weight` packed (core/kernels.py), x [T, in] -> [T, out]
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, bool pad) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                            c10::List<std::optional<c10::Scalar>>, std::optional<std::string_view>)>();
  const c10::List<std::optional<c10::Scalar>> none;
  if (pad && x.size(0) == 1)  // this weight's one-row kernel rounds otherwise: two rows, the second zeros
    return op.call(at::cat({x, at::zeros_like(x)}), weight, bias, "none", none, std::nullopt).narrow(0, 0, 1);
  return op.call(x, weight, bias, "none", none, std::nullopt);
}

// f(i, m) over [0, n) kLanes at a time, the last few (m < kLanes) in a vector of their own (`widen_first`,
// `narrow_first`): every value goes through the same vector code wherever it sits
template <typename F>
inline void in_vectors(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, n - i);
}

// m values at p as floats (m <= kLanes), and back
template <typename T>
inline Floats load(const T* p, int64_t m) {
  return m == kLanes ? widen(p) : specbench::widen_first(p, m);
}
template <typename T>
inline void store(Floats x, T* p, int64_t m) {
  if (m == kLanes)
    narrow(x, p);
  else
    specbench::narrow_first(x, p, m);
}

// RMSNorm of n values at x into out, as Hugging Face's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, rounded,
// times the weight, rounded. The squares are summed in kLanes partial sums, added in lane order.
template <typename T>
inline void rms_norm(const T* x, const T* weight, T* out, int64_t n, float eps) {
  Floats partial = {};
  in_vectors(n, [&](int64_t i, int64_t m) {
    const Floats v = load(x + i, m);
    partial += v * v;
  });
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += partial[l];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  in_vectors(n, [&](int64_t i, int64_t m) {
    const Floats normed = rounded<T>(load(x + i, m) * inv);
    store(load(weight + i, m) * normed, out + i, m);
  });
}

// one head's d values rotated in place (the rotate-half convention): x*cos + rotate(x)*sin, each product rounded
template <typename T>
inline void rotate(T* x, const T* cos, const T* sin, int64_t d) {
  const int64_t half = d / 2;
  T turned[512];
  for (int64_t i = 0; i < half; ++i) {
    turned[i] = static_cast<T>(-static_cast<float>(x[i + half]));
    turned[i + half] = x[i];
  }
  in_vectors(d, [&](int64_t i, int64_t m) {
    const Floats a = rounded<T>(load(x + i, m) * load(cos + i, m));
    const Floats b = rounded<T>(load(turned + i, m) * load(sin + i, m));
    store(a + b, x + i, m);
  });
}

// rows [first, last) of the parallel loops below: rows apart from the first few run on other threads; every row's
// arithmetic is the same whichever thread runs it
template <typename F>
void each_row(int64_t rows, F&& f) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) f(t);
  });
}

struct Layout {
  int64_t heads, kv_heads, head_dim, batch, rows;  // rows: each sequence's padded rows (R)
  float eps;
};

template <typename T>
struct Layers {
  const Layout& at;
  const at::Tensor& cos;
  const at::Tensor& sin;
  const at::Tensor& place;  // [T] each real row's index in the padded [B * R] layout
  const at::Tensor& slots;  // [T] each real row's cache slot

  // q heads (normalised where q_norm is given, rotated) into q [B * R, heads, d] at each row's place, k (the same)
  // and v into the layer's cache kv [2, B, kv heads, S, d] at each row's slot
  void place_qkv(const at::Tensor& qkv, const std::optional<at::Tensor>& q_norm,
                 const std::optional<at::Tensor>& k_norm, at::Tensor& q, at::Tensor& kv) const {
    const int64_t d = at.head_dim, hq = at.heads, hk = at.kv_heads, width = qkv.size(1);
    const T* src = qkv.data_ptr<T>();
    const T* cp = cos.data_ptr<T>();
    const T* sp = sin.data_ptr<T>();
    const int64_t* pp = place.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const T* qn = q_norm ? q_norm->data_ptr<T>() : nullptr;
    const T* kn = k_norm ? k_norm->data_ptr<T>() : nullptr;
    T* qp = q.data_ptr<T>();
    T* kp = kv.data_ptr<T>();
    const auto ks = kv.strides();
    each_row(qkv.size(0), [&](int64_t t) {
      const T* row = src + t * width;
      const int64_t b = pp[t] / at.rows;
      for (int64_t h = 0; h < hq + 2 * hk; ++h) {
        T* dst;
        if (h < hq) {
          dst = qp + (pp[t] * hq + h) * d;
        } else {
          const int64_t which = h < hq + hk ? 0 : 1;
          dst = kp + which * ks[0] + b * ks[1] + (h - hq - which * hk) * ks[2] + slot[t] * ks[3];
        }
        const T* norm = h < hq ? qn : (h < hq + hk ? kn : nullptr);
        if (norm != nullptr)
          rms_norm(row + h * d, norm, dst, d, at.eps);
        else
          std::copy(row + h * d, row + (h + 1) * d, dst);
        if (h < hq + hk) rotate(dst, cp + t * d, sp + t * d, d);
      }
    });
  }

  // x [T, H] normalised row by row into out
  void norm(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out) const {
    const int64_t n = x.size(1);
    const T* xp = x.data_ptr<T>();
    const T* wp = weight.data_ptr<T>();
    T* op = out.data_ptr<T>();
    each_row(x.size(0), [&](int64_t t) { rms_norm(xp + t * n, wp, op + t * n, n, at.eps); });
  }

  // h += x, rounded (the residual stream)
  static void add(at::Tensor& h, const at::Tensor& x) {
    const int64_t n = h.size(1);
    T* hp = h.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    each_row(h.size(0), [&](int64_t t) {
      T* dst = hp + t * n;
      const T* src = xp + t * n;
      in_vectors(n, [&](int64_t i, int64_t m) { store(load(dst + i, m) + load(src + i, m), dst + i, m); });
    });
  }

  // silu(gate) * up of gate_up [T, 2I] (gate first), each rounded, into out [T, I]
  static void gated(const at::Tensor& gate_up, at::Tensor& out) {
    const int64_t n = out.size(1);
    const T* gp = gate_up.data_ptr<T>();
    T* op = out.data_ptr<T>();
    each_row(out.size(0), [&](int64_t t) {
      const T* gate = gp + t * 2 * n;
      const T* up = gate + n;
      T* dst = op + t * n;
      in_vectors(n, [&](int64_t i, int64_t m) {
        const Floats g = load(gate + i, m);
        const Floats silu = rounded<T>(g / (1.0f + specbench::exp_clamped(-g)));
        store(silu * load(up + i, m), dst + i, m);
      });
    });
  }
};

std::tuple<at::Tensor, std::vector<at::Tensor>> decoder_layers(
    const at::Tensor& hidden, at::TensorList weights, const c10::List<std::optional<at::Tensor>>& extras,
    const at::Tensor& cos, const at::Tensor& sin, at::TensorList kv, const at::Tensor& mask, const at::Tensor& place,
    const at::Tensor& slots, int64_t heads, int64_t kv_heads, double eps, double scale, at::IntArrayRef pad,
    at::IntArrayRef capture) {
  const int64_t layers = static_cast<int64_t>(kv.size()), rows = hidden.size(0), d = cos.size(1);
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "decoder_layers: h [T, H], contiguous");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kWeights * layers &&
                  static_cast<int64_t>(extras.size()) == kExtras * layers,
              "decoder_layers: 6 weights and 6 extras per layer");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == rows && sin.sizes() == cos.sizes(),
              "decoder_layers: cos, sin [T, d], contiguous");
  TORCH_CHECK(place.scalar_type() == at::kLong && slots.scalar_type() == at::kLong && place.size(0) == rows &&
                  slots.size(0) == rows && place.is_contiguous() && slots.is_contiguous(),
              "decoder_layers: place and slots, [T] longs");
  TORCH_CHECK(d <= 512 && d % 2 == 0, "decoder_layers: an even head dim up to 512");
  Layout layout{heads, kv_heads, d, mask.size(0), mask.size(1), static_cast<float>(eps)};
  bool pads[4] = {};
  for (const int64_t g : pad) pads[g] = true;
  // every row's place is its own when the sequences' rows are not padded (one sequence): no scatter, no gather
  const bool dense = layout.batch * layout.rows == rows;
  at::Tensor h = hidden.clone();
  at::Tensor x = at::empty_like(h);
  at::Tensor q = at::zeros({layout.batch * layout.rows, heads, d}, h.options());  // padding rows stay zeros
  std::vector<at::Tensor> captured;
  size_t next_capture = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, h.scalar_type(), "decoder_layers", [&] {
    const Layers<scalar_t> step{layout, cos, sin, place, slots};
    for (int64_t i = 0; i < layers; ++i) {
      const at::Tensor* w = weights.data() + i * kWeights;
      const auto extra = [&](int64_t j) { return extras.get(i * kExtras + j); };
      at::Tensor cache = kv[i];
      step.norm(h, w[0], x);
      const at::Tensor qkv = linear(x, w[1], extra(kQKV), pads[kQKV]);
      step.place_qkv(qkv, extra(4), extra(5), q, cache);
      at::Tensor attended =
          specbench::row_attention(q.view({layout.batch, layout.rows, heads, d}).transpose(1, 2), cache[0], cache[1],
                                   mask, scale)
              .view({layout.batch * layout.rows, heads * d});
      if (!dense) attended = attended.index_select(0, place);
      Layers<scalar_t>::add(h, linear(attended, w[2], extra(kOut), pads[kOut]));
      step.norm(h, w[3], x);
      const at::Tensor gate_up = linear(x, w[4], extra(kGateUp), pads[kGateUp]);
      at::Tensor inner = at::empty({rows, gate_up.size(1) / 2}, h.options());
      Layers<scalar_t>::gated(gate_up, inner);
      Layers<scalar_t>::add(h, linear(inner, w[5], extra(kDown), pads[kDown]));
      if (next_capture < capture.size() && capture[next_capture] == i) {
        captured.push_back(h.clone());
        ++next_capture;
      }
    }
  });
  return {h, captured};
}

}  // namespace

// registered for every backend (CompositeImplicitAutograd): the packed weights are oneDNN tensors (MkldnnCPU)
TORCH_LIBRARY_FRAGMENT(specbench, m) {
  m.def("decoder_layers(Tensor h, Tensor[] weights, Tensor?[] extras, Tensor cos, Tensor sin, Tensor[] kv, "
        "Tensor mask, Tensor place, Tensor slots, int heads, int kv_heads, float eps, float scale, int[] pad, "
        "int[] capture) -> (Tensor, Tensor[])",
        &decoder_layers);
}
