// Attention in fp32 whose every output has the same bits whatever else shares the call (eagle3/attention.py says why).
//
// out[b, h, t] = sum_j softmax_j(q . k_j / sqrt(D)) v_j over the keys j that mask[b, t] lets query t see.
// A query is computed on its own, visiting its visible keys in index order and skipping the rest:
//   1. scores: q . k_j as 16 lane-wise partial sums over D (fixed width, so the compiler's vector code is the same
//      for every key) then added across lanes in one fixed order;
//   2. softmax: the max, exp(s - max) lane-wise (own polynomial, one code path), the sum in key order;
//   3. out = sum_j p_j v_j in key order, lane-wise over D, divided by the sum.
// So a query's bits depend only on its q and on the sequence of keys it sees, never on how many queries, rows or
// masked keys (padding, other tree branches) the call holds, nor on where in the buffer its keys sit: a decode step
// and a verify forward over the same tokens agree bit for bit, as lossless speculation needs.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

// A query's math is written over 16 lanes. With AVX-512 a lane group is one zmm; on AVX2 it is two ymm, held as two
// native vectors: GCC lowers a 16-lane vector type on AVX2 by keeping it in memory (the value loop's accumulators
// went through the stack each key: 61 ns a key and query on a Zen 3 EPYC, against 6.5 with native vectors), while
// the lane-wise operations and their order, so the bits, stay the same.
#ifdef __AVX512F__
constexpr int W = 16;
#else
constexpr int W = 8;
#endif
typedef float vec __attribute__((vector_size(4 * W)));
typedef int32_t ivec __attribute__((vector_size(4 * W)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
constexpr int L = 16, P = L / W;  // lanes of the math; native vectors per 16 lanes

inline vec load(const float* p) {
  vec x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// The 16 lanes (P vectors) added in one fixed tree (halves, quarters, ...).
inline float hsum(const vec* a) {
  // Preprocessor, not `if constexpr`: outside a template both branches must compile for the one vector width.
#ifdef __AVX512F__
  v8 b = __builtin_shufflevector(a[0], a[0], 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(a[0], a[0], 8, 9, 10, 11, 12, 13, 14, 15);
#else
  v8 b = a[0] + a[1];
#endif
  v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// exp lane-wise (inputs <= 0: s - max): x = n ln2 + r, |r| <= ln2 / 2, a degree-7 Taylor polynomial in r (relative
// error < 3e-8), times 2^n through the exponent bits. Own code rather than libm's, so every lane takes one path.
inline vec exp_lanes(vec x) {
  const vec lo = vec{} - 87.0f;
  x = x < lo ? lo : x;
  vec n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 * 2^23 trick)
  vec r = x - n * 0.693145752f - n * 1.42860677e-6f;     // ln2 in two parts
  vec p = r * (1.0f / 5040) + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
  return p * reinterpret_cast<vec&>(bits);
}

struct Keys {  // keys j < split from (k, v), the rest from (k2, v2): a cache and a forward's new keys
  const float *k, *v, *k2, *v2;
  int64_t ks, vs, k2s, v2s, split;
  const float* key(int64_t j) const { return j < split ? k + j * ks : k2 + (j - split) * k2s; }
  const float* value(int64_t j) const { return j < split ? v + j * vs : v2 + (j - split) * v2s; }
};

// One query over its visible keys, in index order (NV = D / W native vectors per head).
template <int NV>
void query(const float* qi, const Keys& kv, const bool* m, int64_t ms, int64_t S, float scale, float* score,
           int64_t* seen, float* o) {
  vec q[NV], acc[NV];
  for (int c = 0; c < NV; ++c) q[c] = load(qi + c * W) * scale;
  int64_t n = 0;
  float top = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    if (!m[j * ms]) continue;
    const float* kj = kv.key(j);
    vec a[P];
    for (int e = 0; e < P; ++e) a[e] = q[e] * load(kj + e * W);
    for (int c = P; c < NV; ++c) a[c % P] += q[c] * load(kj + c * W);
    const float s = hsum(a);
    score[n] = s;
    seen[n++] = j;
    top = s > top ? s : top;
  }
  if (n == 0) {  // a query that sees nothing (padding): zeros, not NaN
    std::fill(o, o + NV * W, 0.0f);
    return;
  }
  for (int64_t j = n; j < (n + L - 1) / L * L; ++j) score[j] = top;  // whole blocks: exp(0), never summed
  for (int64_t j = 0; j < n; j += W) {
    vec e = exp_lanes(load(score + j) - top);
    std::memcpy(score + j, &e, sizeof e);
  }
  float sum = 0.0f;
  for (int c = 0; c < NV; ++c) acc[c] = vec{};
  for (int64_t j = 0; j < n; ++j) {
    const float p = score[j];
    const float* vj = kv.value(seen[j]);
    sum += p;
    for (int c = 0; c < NV; ++c) acc[c] += p * load(vj + c * W);
  }
  const float inv = 1.0f / sum;
  for (int c = 0; c < NV; ++c) {
    vec r = acc[c] * inv;
    std::memcpy(o + c * W, &r, sizeof r);
  }
}

// q [B, Hq, T, D]; keys and values [B, Hkv, S, D] then [B, Hkv, S2, D] (unit stride in D); mask [B, 1, T, S + S2]
// bool (any strides) -> [B, Hq, T, D].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k2,
                  const at::Tensor& v2, const at::Tensor& mask) {
  for (auto* t : {&q, &k, &v, &k2, &v2})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 4 && t->stride(3) == 1, "attend: fp32 [B, H, S, D]");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 4, "attend: mask [B, 1, T, S] bool");
  auto qc = q.contiguous();
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2) + k2.size(2), G = Hq / Hkv;
  TORCH_CHECK(Hq % Hkv == 0 && v.sizes() == k.sizes() && v2.sizes() == k2.sizes() && k2.size(1) == Hkv,
              "attend: grouped heads, keys and values alike");
  TORCH_CHECK(mask.size(0) == B && mask.size(2) == T && mask.size(3) == S, "attend: mask shape");
  auto out = at::empty({B, Hq, T, D}, q.options());
  const float* qp = qc.data_ptr<float>();
  const bool* mp = mask.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  const int64_t mb = mask.stride(0), mt = mask.stride(2), ms = mask.stride(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto run = [&](auto nv) {
    constexpr int NV = decltype(nv)::value;
    at::parallel_for(0, B * Hq * T, 8, [&](int64_t begin, int64_t end) {
      std::vector<float> score(S + L);
      std::vector<int64_t> seen(S);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = i / (Hq * T), h = i / T % Hq / G, t = i % T;
        const Keys kv{k.data_ptr<float>() + b * k.stride(0) + h * k.stride(1),
                      v.data_ptr<float>() + b * v.stride(0) + h * v.stride(1),
                      k2.data_ptr<float>() + b * k2.stride(0) + h * k2.stride(1),
                      v2.data_ptr<float>() + b * v2.stride(0) + h * v2.stride(1),
                      k.stride(2), v.stride(2), k2.stride(2), v2.stride(2), k.size(2)};
        query<NV>(qp + i * D, kv, mp + b * mb + t * mt, ms, S, scale, score.data(), seen.data(), op + i * D);
      }
    });
  };
  switch (D) {
    case 16: run(std::integral_constant<int, 16 / W>{}); break;
    case 32: run(std::integral_constant<int, 32 / W>{}); break;
    case 64: run(std::integral_constant<int, 64 / W>{}); break;
    case 128: run(std::integral_constant<int, 128 / W>{}); break;
    default: TORCH_CHECK(false, "attend: head dim 16, 32, 64 or 128");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(eagle3_attention, m) {
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor k2, Tensor v2, Tensor mask) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle3_attention, CPU, m) { m.impl("attend", &attend); }
