// The VNNI kernel (vnni_mm.cpp) for CPUs with AVX2 alone: the same packed blocks, the same activation digits and the
// same float operations in the same order, so it gives the same bits; fp32 activations and outputs (the engine's
// dtype there). eagle3/vnni.py says why.
//
// AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned weight bytes by signed activation bytes and adds each pair into
// an int16 lane (saturating), vpmaddwd then adds pairs of those into int32. A Q4_1 pair is at most 2 * 15 * 127 =
// 3810, so the 8 pairs of lane (c, 2j) over a block add up in int16 without saturating (30480); the int32 step runs
// once per block. A Q8_0 weight (stored as q + 128, up to 255) would saturate a pair, so it is turned back into the
// signed q and multiplied as |q| times x with q's sign (vpsignb; a pair is at most 2 * 128 * 127 = 32512), summed
// into int32 at every step, and sum((q + 128) * x) = sum(q * x) + 128 * sum(x) gives exactly the same integer sum.
// (It had been split into two nibbles, two Q4 products: half again as many instructions a block.)
//
// A ymm holds 8 columns, half of a 16-column panel: each half of the panel makes its own pass over the blocks (the
// panel, at most 24 KB, stays in L1 between the passes).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <type_traits>
#include <vector>

namespace {

constexpr int COLS = 16, HALF = 8, BLOCK = 32, S = 2 * COLS;

// Quad-vector t (0..7) of a block for half h of the panel (lane c: 4 bytes, column 8h + c at inputs 4t..4t+3).
// Q4_1: 4 unsigned bytes in 0..15, a nibble of nibble vector t / 2. Q8_0: the signed q (stored as q + 128).
struct Q4 {
  static constexpr int W = BLOCK / 2 * COLS;
  static __m256i quad(const uint8_t* wb, int h, int t) {
    const __m256i packed = _mm256_loadu_si256((const __m256i*)(wb + 64 * (t / 2) + 32 * h));
    return _mm256_and_si256(t % 2 ? _mm256_srli_epi16(packed, 4) : packed, _mm256_set1_epi8(0x0F));
  }
};

struct Q8 {
  static constexpr int W = BLOCK * COLS;
  static __m256i quad(const uint8_t* wb, int h, int t) {
    const __m256i bytes = _mm256_loadu_si256((const __m256i*)(wb + 64 * t + 32 * h));
    return _mm256_xor_si256(bytes, _mm256_set1_epi8((char)0x80));
  }
};

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

inline void store8(int8_t* dst, __m256i v) {  // 8 int32 in -128..127 -> 8 bytes
  alignas(32) int32_t tmp[8];
  _mm256_store_si256((__m256i*)tmp, v);
  for (int i = 0; i < 8; ++i) dst[i] = (int8_t)tmp[i];
}

// As vnni_mm.cpp's quantise, operation for operation (round to nearest even, the same multiplies).
template <int DIGITS>
void quantise(const float* x, int64_t M, int64_t K, int8_t* xq1, int8_t* xq2, float* dx, float* sx, int32_t* xs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < M * K / BLOCK; ++i) {
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int h = 0; h < 4; ++h) {
      v[h] = _mm256_loadu_ps(x + i * BLOCK + 8 * h);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[h]));
    }
    const float top = hmax(amax), step = top / 127.0f, inv = top > 0 ? 1.0f / step : 0.0f;
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 4; ++h) {
      const __m256 scaled = _mm256_mul_ps(v[h], _mm256_set1_ps(inv));
      const __m256i q1 = _mm256_cvtps_epi32(scaled);
      store8(xq1 + i * BLOCK + 8 * h, q1);
      if (DIGITS == 1) {
        sum = _mm256_add_epi32(sum, q1);
      } else {
        const __m256i q2 = _mm256_cvtps_epi32(
            _mm256_mul_ps(_mm256_sub_ps(scaled, _mm256_cvtepi32_ps(q1)), _mm256_set1_ps(128.0f)));
        store8(xq2 + i * BLOCK + 8 * h, q2);
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_slli_epi32(q1, 7), q2));
      }
    }
    dx[i] = DIGITS == 1 ? step : step / 128.0f;
    xs[i] = hsum(sum);
    sx[i] = dx[i] * (float)xs[i];
  }
}

// The integer sums sum(w * X) of R rows with half h of a panel's block b, w as stored (Q8_0: q + 128). Each
// quad-vector is unpacked once for the R rows, and the rows' sums (one per row and digit) are independent chains
// the core runs side by side.
template <int R, int DIGITS>
void block_sums(Q4, const uint8_t* wb, int h, const int8_t* const* xq, int64_t K, int64_t b, const int32_t*, int64_t,
                __m256i* isum) {
  __m256i s16[R][DIGITS];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < DIGITS; ++g) s16[r][g] = _mm256_setzero_si256();
  for (int t = 0; t < 8; ++t) {
    const __m256i q = Q4::quad(wb, h, t);
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < DIGITS; ++g) {
        const int32_t x = ((const int32_t*)(xq[g] + r * K + b * BLOCK))[t];
        s16[r][g] = _mm256_add_epi16(s16[r][g], _mm256_maddubs_epi16(q, _mm256_set1_epi32(x)));
      }
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) {  // sum q * X = 128 * sum q * xq1 + sum q * xq2
    isum[r] = _mm256_madd_epi16(s16[r][0], ones);
    if (DIGITS == 2) isum[r] = _mm256_add_epi32(_mm256_slli_epi32(isum[r], 7), _mm256_madd_epi16(s16[r][1], ones));
  }
}

template <int R, int DIGITS>
void block_sums(Q8, const uint8_t* wb, int h, const int8_t* const* xq, int64_t K, int64_t b, const int32_t* xs,
                int64_t G, __m256i* isum) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s32[R][DIGITS];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < DIGITS; ++g) s32[r][g] = _mm256_setzero_si256();
  for (int t = 0; t < 8; ++t) {
    const __m256i q = Q8::quad(wb, h, t), size = _mm256_abs_epi8(q);  // -128 -> 0x80, read unsigned: 128
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < DIGITS; ++g) {
        const __m256i x = _mm256_set1_epi32(((const int32_t*)(xq[g] + r * K + b * BLOCK))[t]);
        const __m256i pairs = _mm256_maddubs_epi16(size, _mm256_sign_epi8(x, q));
        s32[r][g] = _mm256_add_epi32(s32[r][g], _mm256_madd_epi16(pairs, ones));
      }
  }
  for (int r = 0; r < R; ++r) {  // sum (q + 128) * X = sum q * X + 128 * sum X
    __m256i s = s32[r][0];
    if (DIGITS == 2) s = _mm256_add_epi32(_mm256_slli_epi32(s, 7), s32[r][1]);
    isum[r] = _mm256_add_epi32(s, _mm256_set1_epi32(xs[r * G + b] * 128));
  }
}

// R rows x half h of a panel over all K: per block the integer sums, then y += sums * (d * dx) + m * sx.
template <class F, int R, int DIGITS>
void rows_half(const int8_t* const* xq, const float* dx, const float* sx, const int32_t* xs, int64_t K,
               const uint8_t* w, const uint16_t* sc, int h, float* y, int64_t ldy) {
  const int64_t G = K / BLOCK;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < G; ++b) {
    const uint8_t* wb = w + b * F::W;
    // The next panel's block b, half of it on each pass, so memory streams while this panel is computed from L1:
    // the two passes had alternated between waiting on memory and computing, and a Q8_0 lm_head at one row took
    // 3.6 ms instead of 2.4 on a 2-core AVX2-only EPYC (Zen 3, one thread, a standalone copy of this loop).
    const char* next = (const char*)(wb + G * F::W + h * (F::W / 2));
    for (int line = 0; line < F::W / 2; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
    __m256i isum[R];
    block_sums<R, DIGITS>(F(), wb, h, xq, K, b, xs, G, isum);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sc + b * S + HALF * h)));
    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(sc + b * S + COLS + HALF * h)));
    for (int r = 0; r < R; ++r) {
      const int64_t i = r * G + b;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, _mm256_set1_ps(dx[i])), acc[r]);
      acc[r] = _mm256_fmadd_ps(mn, _mm256_set1_ps(sx[i]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * ldy + HALF * h, acc[r]);
}

constexpr int ROWS = 4;

template <class F, int DIGITS>
void panel(const int8_t* xq1, const int8_t* xq2, const float* dx, const float* sx, const int32_t* xs, int64_t M,
           int64_t K, const uint8_t* w, const uint16_t* sc, float* y, int64_t ldy) {
  const int64_t G = K / BLOCK;
  auto run = [&](auto rows, int64_t m, int h) {
    const int8_t* xq[2] = {xq1 + m * K, DIGITS == 2 ? xq2 + m * K : xq2};
    rows_half<F, decltype(rows)::value, DIGITS>(xq, dx + m * G, sx + m * G, xs + m * G, K, w, sc, h, y + m * ldy,
                                                ldy);
  };
  for (int h = 0; h < 2; ++h) {
    int64_t m = 0;
    for (; m + ROWS <= M; m += ROWS) run(std::integral_constant<int, ROWS>(), m, h);
    switch (M - m) {
      case 3: run(std::integral_constant<int, 3>(), m, h); break;
      case 2: run(std::integral_constant<int, 2>(), m, h); break;
      case 1: run(std::integral_constant<int, 1>(), m, h); break;
      default: break;
    }
  }
}

template <class F, int DIGITS>
void multiply(const float* x, int64_t M, int64_t K, const uint8_t* w, const uint16_t* sc, int64_t panels, float* y) {
  const int64_t G = K / BLOCK, N = panels * COLS;
  std::vector<int8_t> xq1(M * K), xq2(DIGITS == 2 ? M * K : 0);
  std::vector<float> dx(M * G), sx(M * G);
  std::vector<int32_t> xs(M * G);
  quantise<DIGITS>(x, M, K, xq1.data(), xq2.data(), dx.data(), sx.data(), xs.data());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      panel<F, DIGITS>(xq1.data(), xq2.data(), dx.data(), sx.data(), xs.data(), M, K, w + p * G * F::W,
                       sc + p * G * S, y + p * COLS, N);
  });
}

// y = x @ w^T for a packed weight of format F (vnni_mm.cpp's layout); x fp32 [M, K].
template <class F>
at::Tensor mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t digits) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "eagle3_avx2: x must be a 2-d fp32 tensor");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 3 && w.size(2) == F::W && scales.scalar_type() == at::kHalf &&
              scales.dim() == 3 && scales.size(2) == S,
              "eagle3_avx2: w must be uint8 [N/16, K/32, W], scales fp16 [N/16, K/32, 32]");
  TORCH_CHECK(digits == 1 || digits == 2, "eagle3_avx2: digits must be 1 or 2");
  const int64_t M = x.size(0), K = x.size(1), panels = w.size(0), G = K / BLOCK;
  TORCH_CHECK(K % BLOCK == 0 && w.size(1) == G && scales.size(0) == panels && scales.size(1) == G,
              "eagle3_avx2: shapes do not match");
  auto y = at::empty({M, panels * COLS}, x.options());
  if (M == 0) return y;
  const auto xc = x.contiguous();
  const auto* xp = xc.data_ptr<float>();
  const auto* wp = w.data_ptr<uint8_t>();
  const auto* sp = (const uint16_t*)scales.data_ptr();
  if (digits == 1) multiply<F, 1>(xp, M, K, wp, sp, panels, y.data_ptr<float>());
  else multiply<F, 2>(xp, M, K, wp, sp, panels, y.data_ptr<float>());
  return y;
}

}  // namespace

TORCH_LIBRARY(eagle3_avx2, m) {
  m.def("q4_mm(Tensor x, Tensor w, Tensor scales, int digits) -> Tensor");
  m.def("q8_mm(Tensor x, Tensor w, Tensor scales, int digits) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle3_avx2, CPU, m) {
  m.impl("q4_mm", &mm<Q4>);
  m.impl("q8_mm", &mm<Q8>);
}
