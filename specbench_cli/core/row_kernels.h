// What the C++ kernels of specbench share (row_attention.cpp, decoder_layers.cpp): vectors of 16 floats, loading
// and rounding the model's dtype through them, exp, and the row attention kernel's entry point.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace specbench {

constexpr int64_t kLanes = 16;  // the width every vector and every blocked reduction has (a fixed order)

// Vectors of kLanes floats (GCC/Clang vector extensions: one AVX-512 register, two AVX2 ones, four SSE ones).
typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint32_t Words __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t Halfs __attribute__((vector_size(kLanes * sizeof(uint16_t))));

// kLanes values of type T at p as floats
template <typename T>
inline Floats widen(const T* p) {
  Floats x;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&x, p, sizeof(x));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {  // a bf16 is a float's upper 16 bits
    Halfs h;
    std::memcpy(&h, p, sizeof(h));
    const Words w = __builtin_convertvector(h, Words) << 16;
    std::memcpy(&x, &w, sizeof(x));
  } else {
    for (int64_t l = 0; l < kLanes; ++l) x[l] = static_cast<float>(p[l]);
  }
  return x;
}

// x's lanes rounded to T and stored at p: the bits c10's conversions give (bf16: round to nearest even, NaN to
// 0x7FC0, as c10::detail::round_to_nearest_even)
template <typename T>
inline void narrow(Floats x, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &x, sizeof(x));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    Words w;
    std::memcpy(&w, &x, sizeof(w));
    const Words rounded = (w + (((w >> 16) & 1u) + 0x7FFFu)) >> 16;
    const Words nan = reinterpret_cast<Words>(x != x);  // all ones where x is NaN
    const Halfs h = __builtin_convertvector((rounded & ~nan) | (nan & 0x7FC0u), Halfs);
    std::memcpy(p, &h, sizeof(h));
  } else {
    for (int64_t l = 0; l < kLanes; ++l) p[l] = static_cast<T>(x[l]);
  }
}

// x's lanes rounded to T, as floats (what a PyTorch op's T output reads back as)
template <typename T>
inline Floats rounded(Floats x) {
  T held[kLanes];
  narrow(x, held);
  return widen(held);
}

// the first m < kLanes values at p as floats, zeros after them
template <typename T>
inline Floats widen_first(const T* p, int64_t m) {
  T held[kLanes] = {};
  std::copy(p, p + m, held);
  return widen(held);
}

// x's first m < kLanes lanes rounded to T and stored at p
template <typename T>
inline void narrow_first(Floats x, T* p, int64_t m) {
  T held[kLanes];
  narrow(x, held);
  std::copy(held, held + m, p);
}

// exp of every lane, branch-free: Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial), a
// few ulp from std::exp; x clamped to [-87, 88]. Every exp of the kernels comes from here, whole vectors only, so a
// value's exp is the same bits whichever lane or loop computes it.
inline Floats exp_clamped(Floats x) {
  x = x < -87.0f ? Floats{} - 87.0f : x;
  x = x > 88.0f ? Floats{} + 88.0f : x;
  const Floats t = x * 1.44269504088896341f + 0.5f;
  Floats n = __builtin_convertvector(__builtin_convertvector(t, Ints), Floats);  // t truncated toward zero
  n += __builtin_convertvector(n > t, Floats);                                  // -1 where that rounded up: floor
  const Floats r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Floats p = Floats{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const Floats y = p * r * r + r + 1.0f;
  const Ints bits = (__builtin_convertvector(n, Ints) + 127) << 23;
  Floats scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// attention of q [B, H, R, d] over k, v [B, KVH, S, d] where mask [B, R, S] allows, every row alone (row_attention.cpp);
// [B, R, H, d] in q's dtype
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                         double scale);

}  // namespace specbench
