// What the C++ kernels of specbench share (row_attention.cpp, decoder_layers.cpp).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specbench {

// exp(x), branch-free so that a loop of it vectorizes: Cephes' expf (range reduction by ln 2 in two parts, a degree-5
// polynomial), a few ulp from std::exp; x clamped to [-87, 88]
inline float exp_clamped(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// attention of q [B, H, R, d] over k, v [B, KVH, S, d] where mask [B, R, S] allows, every row alone (row_attention.cpp);
// [B, R, H, d] in q's dtype
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                         double scale);

}  // namespace specbench
