// Greedy picks over bf16 logits without materialising them in fp32 (eagle3/argmax.py says why).
//
// out[r] = the first index of the largest value of row r, exactly what logits.float().argmax(-1) returns: each of 16
// lanes keeps its largest value and the first index that reached it (strict >), and the lanes are merged by value,
// ties to the smaller index. bf16 -> fp32 is a 16-bit shift, so the comparison is on the same fp32 values.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>
#include <cstring>

namespace {

constexpr int L = 16;

int64_t row_argmax(const uint16_t* x, int64_t V) {
  float best[L];
  int64_t at[L];
  for (int l = 0; l < L; ++l) best[l] = -INFINITY, at[l] = l;
  int64_t j = 0;
  for (; j + L <= V; j += L) {
    for (int l = 0; l < L; ++l) {
      uint32_t bits = static_cast<uint32_t>(x[j + l]) << 16;
      float v;
      std::memcpy(&v, &bits, sizeof v);
      const bool more = v > best[l];
      best[l] = more ? v : best[l];
      at[l] = more ? j + l : at[l];
    }
  }
  float top = best[0];
  int64_t idx = at[0];
  for (int l = 1; l < L; ++l)
    if (best[l] > top || (best[l] == top && at[l] < idx)) top = best[l], idx = at[l];
  for (; j < V; ++j) {  // the tail, after every earlier index
    uint32_t bits = static_cast<uint32_t>(x[j]) << 16;
    float v;
    std::memcpy(&v, &bits, sizeof v);
    if (v > top) top = v, idx = j;
  }
  return idx;
}

// logits [R, V] bf16, contiguous -> [R] int64.
at::Tensor argmax_bf16(const at::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 && logits.dim() == 2 && logits.is_contiguous(),
              "argmax_bf16: contiguous [R, V] bf16");
  const int64_t R = logits.size(0), V = logits.size(1);
  auto out = at::empty({R}, logits.options().dtype(at::kLong));
  const uint16_t* x = reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>());
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = row_argmax(x + r * V, V);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(eagle3_argmax, m) { m.def("argmax_bf16(Tensor logits) -> Tensor"); }
TORCH_LIBRARY_IMPL(eagle3_argmax, CPU, m) { m.impl("argmax_bf16", &argmax_bf16); }
