// What the C++ kernels of specbench share (row_attention.cpp, decoder_layers.cpp).
#pragma once

#include <ATen/ATen.h>

namespace specbench {

// attention of q [B, H, R, d] over k, v [B, KVH, S, d] where mask [B, R, S] allows, every row alone (row_attention.cpp);
// [B, R, H, d] in q's dtype
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                         double scale);

}  // namespace specbench
