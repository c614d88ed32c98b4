// The target's Q4_1 linears on CPUs with AVX512-VNNI but no AMX: activations quantised to 8-bit blocks (one digit,
// as llama.cpp, or two), integer dot products with the GGUF's 4-bit blocks, one float multiply-add per block
// (eagle3/vnni.py says why).
//
// y[m, n] = sum over blocks b of 32 inputs: d[n,b] * dx[m,b] * isum[m,n,b] + mn[n,b] * sx[m,b], where
//   w[n, k] = q * d + mn (Q4_1, q in 0..15), x[m, k] ~ X * dx (X integer, see quantise),
//   isum = sum_k q * X (exact, int32), sx = dx * sum_k X.
// vpdpbusd multiplies 4 unsigned bytes (the weights) by 4 signed ones (an activation digit) per 32-bit lane and adds
// them into the lane: lane c of a 16-lane vector is output column c, its 4 bytes 4 consecutive inputs.
//
// Each row is quantised on its own and its blocks are summed in one order, so a row's output has the same bits
// whatever the number of rows in the call: verify forwards match plain steps.
//
// Packed layout (eagle3/vnni.py pack_q4, pack_q8): Q4_1 weights [N/16, K/32, 256] bytes, scales [N/16, K/32, 32] fp16 (d of the 16
// columns, then their mn), so a panel of 16 columns streams one contiguous run. Byte i (0..63) of nibble vector v
// (0..3) holds quad-vector 2v's byte i in its low nibble and quad-vector 2v + 1's in its high nibble; byte 4c + e of
// quad-vector t (0..7) is q at input 4t + e of the block, column c. Q8_0 weights [N/16, K/32, 512]: the 8
// quad-vectors in turn.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <cmath>
#include <type_traits>
#include <vector>

namespace {

constexpr int COLS = 16, BLOCK = 32, S = 2 * COLS;  // S: fp16 scales per block and panel (d, then mn)

// The weight formats: the 8 quad-vectors of one block and panel (lane c: 4 unsigned bytes, column c's q at 4
// consecutive inputs), from W bytes. Q4_1: nibbles, mn the block's minimum. Q8_0 (signed q * d) is stored as q + 128
// with mn = -128 * d (eagle3/vnni.py pack_q8), so one formula serves both.
struct Q4 {
  static constexpr int W = BLOCK / 2 * COLS;
  static void load(const uint8_t* wb, __m512i* q) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int v = 0; v < 4; ++v) {
      const __m512i packed = _mm512_loadu_si512(wb + 64 * v);
      q[2 * v] = _mm512_and_si512(packed, nib);
      q[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nib);
    }
  }
};

struct Q8 {
  static constexpr int W = BLOCK * COLS;
  static void load(const uint8_t* wb, __m512i* q) {
    for (int t = 0; t < 8; ++t) q[t] = _mm512_loadu_si512(wb + 64 * t);
  }
};

// Activations and outputs are bf16 (uint16_t bits) or fp32, the engine's dtype: 16 of them to and from fp32 lanes.
// bf16 rounds to nearest even in integers, so no AVX512-BF16 instruction is needed (CPUs with VNNI but no BF16).
inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
inline __m512 load16(const uint16_t* x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)x)), 16));
}
inline void store16(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
inline void store16(uint16_t* y, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  _mm256_storeu_si256((__m256i*)y, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

// x [M, K] (bf16 or fp32) -> per block of 32 (rows independent): digits xq1 (and xq2) int8 [M, K], dx and sx
// [M, K/32] fp32, with x ~ X * dx, X = xq1 (one digit) or 128 * xq1 + xq2 (two: xq2 = round(128 * (x / step - xq1)),
// |xq2| <= 64), sx = dx * sum X, step = max|x| / 127.
template <int DIGITS, class T>
void quantise(const T* x, int64_t M, int64_t K, int8_t* xq1, int8_t* xq2, float* dx, float* sx) {
  for (int64_t i = 0; i < M * K / BLOCK; ++i) {
    __m512 v[2];
    float amax = 0;
    for (int h = 0; h < 2; ++h) {
      v[h] = load16(x + i * BLOCK + 16 * h);
      amax = std::max(amax, _mm512_reduce_max_ps(_mm512_abs_ps(v[h])));
    }
    const float step = amax / 127.0f, inv = amax > 0 ? 1.0f / step : 0.0f;
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512 scaled = _mm512_mul_ps(v[h], _mm512_set1_ps(inv));
      const __m512i q1 = _mm512_cvtps_epi32(scaled);  // round to nearest even
      _mm_storeu_si128((__m128i*)(xq1 + i * BLOCK + 16 * h), _mm512_cvtepi32_epi8(q1));
      if (DIGITS == 1) {
        sum = _mm512_add_epi32(sum, q1);
      } else {  // the rest of the step, exactly (scaled and q1 are within 0.5), in 128ths
        const __m512i q2 = _mm512_cvtps_epi32(
            _mm512_mul_ps(_mm512_sub_ps(scaled, _mm512_cvtepi32_ps(q1)), _mm512_set1_ps(128.0f)));
        _mm_storeu_si128((__m128i*)(xq2 + i * BLOCK + 16 * h), _mm512_cvtepi32_epi8(q2));
        sum = _mm512_add_epi32(sum, _mm512_add_epi32(_mm512_slli_epi32(q1, 7), q2));
      }
    }
    dx[i] = DIGITS == 1 ? step : step / 128.0f;  // exact: a power of two
    sx[i] = dx[i] * (float)_mm512_reduce_add_epi32(sum);  // the sum is exact in int32
  }
}

// sum over the block's 32 inputs of q * x per column: two chains of 4 vpdpbusd (each waits for the last one's
// sum), so the core has more of them in flight; integer sums are exact, so their order does not matter.
inline __m512i dot8(const __m512i* q, const int32_t* x) {
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  for (int t = 0; t < 8; t += 2) {
    a = _mm512_dpbusd_epi32(a, q[t], _mm512_set1_epi32(x[t]));
    b = _mm512_dpbusd_epi32(b, q[t + 1], _mm512_set1_epi32(x[t + 1]));
  }
  return _mm512_add_epi32(a, b);
}

// R rows (m0..) x one panel of 16 columns over all K: the panel's blocks are unpacked once per R rows.
template <class F, int R, int DIGITS, class T>
void rows_panel(const int8_t* xq1, const int8_t* xq2, const float* dx, const float* sx, int64_t K, const uint8_t* w,
                const uint16_t* sc, T* y, int64_t ldy) {
  const int64_t G = K / BLOCK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < G; ++b) {
    const uint8_t* wb = w + b * F::W;
    _mm_prefetch((const char*)wb + 4 * F::W, _MM_HINT_T0);
    _mm_prefetch((const char*)wb + 4 * F::W + 128, _MM_HINT_T0);
    __m512i q[8];
    F::load(wb, q);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + b * S)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sc + b * S + COLS)));
    for (int r = 0; r < R; ++r) {
      const int32_t* x1 = (const int32_t*)(xq1 + r * K + b * BLOCK);
      __m512i isum = dot8(q, x1);
      if (DIGITS == 2) {  // sum q * X = 128 * sum q * xq1 + sum q * xq2, exact in int32
        const int32_t* x2 = (const int32_t*)(xq2 + r * K + b * BLOCK);
        isum = _mm512_add_epi32(_mm512_slli_epi32(isum, 7), dot8(q, x2));
      }
      const int64_t i = r * G + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(dx[i])), acc[r]);
      acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(sx[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) store16(y + r * ldy, acc[r]);
}

constexpr int ROWS = 4;  // rows sharing one unpacking of a panel's blocks (registers: 8 weights + 4 sums + 4 outputs)

template <class F, int DIGITS, class T>
void panel(const int8_t* xq1, const int8_t* xq2, const float* dx, const float* sx, int64_t M, int64_t K,
           const uint8_t* w, const uint16_t* sc, T* y, int64_t ldy) {
  const int64_t G = K / BLOCK;
  auto run = [&](auto rows, int64_t m) {
    rows_panel<F, decltype(rows)::value, DIGITS, T>(xq1 + m * K, xq2 + m * K, dx + m * G, sx + m * G, K, w, sc,
                                              y + m * ldy, ldy);
  };
  int64_t m = 0;
  for (; m + ROWS <= M; m += ROWS) run(std::integral_constant<int, ROWS>(), m);
  switch (M - m) {
    case 3: run(std::integral_constant<int, 3>(), m); break;
    case 2: run(std::integral_constant<int, 2>(), m); break;
    case 1: run(std::integral_constant<int, 1>(), m); break;
    default: break;
  }
}

template <class F, int DIGITS, class T>
void multiply(const T* x, int64_t M, int64_t K, const uint8_t* w, const uint16_t* sc, int64_t panels, T* y) {
  const int64_t G = K / BLOCK, N = panels * COLS;
  std::vector<int8_t> xq1(M * K), xq2(DIGITS == 2 ? M * K : 0);
  std::vector<float> dx(M * G), sx(M * G);
  quantise<DIGITS, T>(x, M, K, xq1.data(), xq2.data(), dx.data(), sx.data());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      panel<F, DIGITS, T>(xq1.data(), xq2.data(), dx.data(), sx.data(), M, K, w + p * G * F::W, sc + p * G * S,
                          y + p * COLS, N);
  });
}

// y = x @ w^T for a packed weight of format F: w [N/16, K/32, F::W] bytes, scales [N/16, K/32, 32] fp16.
template <class F, class T>
void run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t digits, at::Tensor& y) {
  const auto* xp = (const T*)x.data_ptr();
  const auto* wp = w.data_ptr<uint8_t>();
  const auto* sp = (const uint16_t*)scales.data_ptr();
  auto* yp = (T*)y.data_ptr();
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0);
  if (digits == 1) multiply<F, 1, T>(xp, M, K, wp, sp, panels, yp);
  else multiply<F, 2, T>(xp, M, K, wp, sp, panels, yp);
}

template <class F>
at::Tensor mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t digits) {
  TORCH_CHECK((x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat) && x.dim() == 2,
              "eagle3_vnni: x must be a 2-d bf16 or fp32 tensor");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.size(2) == F::W && scales.scalar_type() == at::kHalf &&
              scales.dim() == 3 && scales.size(2) == S,
              "eagle3_vnni: w must be uint8 [N/16, K/32, W], scales fp16 [N/16, K/32, 32]");
  TORCH_CHECK(digits == 1 || digits == 2, "eagle3_vnni: digits must be 1 or 2");
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0), G = K / BLOCK;
  TORCH_CHECK(K % BLOCK == 0 && w.size(1) == G && scales.size(0) == panels && scales.size(1) == G,
              "eagle3_vnni: shapes do not match");
  auto y = at::empty({M, panels * COLS}, x.options());
  if (M == 0) return y;
  if (x.scalar_type() == at::kFloat) run<F, float>(x.contiguous(), w, scales, digits, y);
  else run<F, uint16_t>(x.contiguous(), w, scales, digits, y);
  return y;
}

}  // namespace

TORCH_LIBRARY(eagle3_vnni, m) {
  m.def("q4_mm(Tensor x, Tensor w, Tensor scales, int digits) -> Tensor");
  m.def("q8_mm(Tensor x, Tensor w, Tensor scales, int digits) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle3_vnni, CPU, m) {
  m.impl("q4_mm", &mm<Q4>);
  m.impl("q8_mm", &mm<Q8>);
}
