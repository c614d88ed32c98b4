// The target's Q4_1 linears and Q8_0 lm_head on CPUs with AMX, at a cost that barely grows from 1 to 16 rows
// (eagle3/amx.py says why).
//
// y[M, N] = x[M, K] (bf16) @ w^T, with w[n, k] = q * d + m (Q4_1) or q * d (Q8_0) per block of 32 inputs, the
// GGUF's blocks exactly, computed in fp32 and rounded to bf16: the layer's dense weight.
// Per 64 output columns (4 panels of 16), each block of 32 inputs is dequantised once into bf16 in AMX's pair layout
// and multiplied at once (tdpbf16ps) with the first 16 rows of x, while it sits in L1; further row tiles reuse it.
// A C tile accumulates the blocks in order, and tiles multiply rows independently, so a row's output has the same
// bits whatever the number of rows in the call: verify forwards match plain steps.
//
// Packed layout (eagle3/amx.py pack_q4, pack_q8): weights [N/64, K/32, 4, W] bytes and scales [N/64, K/32, 4, S]
// fp16, so a thread streams one contiguous run. A k-pair's values come in the order of cvtne2ps's output lanes:
// lane i (of 32) is column i / 2 (+ 8 from lane 16 on) at k parity i % 2, which is AMX's pair layout with no shuffle
// after the conversion. Q4_1 keeps lanes i and 16 + i in byte i's low and high nibble; Q8_0 one byte per lane.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr int PREFETCH = 4096;  // bytes ahead in the weight stream (less in the scales', which are smaller)
constexpr int COLS = 16, BLOCK = 32, PANELS = 4;  // a tile's columns, a Q4_1 block's inputs, panels per A load

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool amx_permitted() {  // Linux hands out AMX state only on request (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// A block's per-column scale [16] spread to the lanes of cvtne2ps's two inputs (lane i: column i / 2, + 8 in hi).
inline void spread(__m512 v, __m512& lo, __m512& hi) {
  const __m512i lanes = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  lo = _mm512_permutexvar_ps(lanes, v);
  hi = _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(8)), v);
}

// The weight formats. Each turns one block (32 inputs) of one panel (16 columns) into bf16 in AMX's pair layout,
// out[j][2c + e] = w[k = 2j + e][c], reading W bytes of weights and S fp16 scales per block and panel.
// Q4_1: w = q * d + m, q in 0..15 (nibbles), d and m per column. Q8_0: w = q * d, q in -128..127, d per column.
// Both compute w in fp32 (exactly: the products of fp16 scales and small integers fit fp32) and round it to bf16.
struct Q4 {
  static constexpr int W = BLOCK / 2 * COLS, S = 2 * COLS;
  static void dequant(const uint8_t* w, const uint16_t* dm, uint16_t* out) {
    const __m512i nib = _mm512_set1_epi32(0x0F);
    _mm_prefetch((const char*)dm + PREFETCH / 4, _MM_HINT_T0);
    __m512 d_lo, d_hi, m_lo, m_hi;
    spread(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)dm)), d_lo, d_hi);
    spread(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dm + COLS))), m_lo, m_hi);
    for (int j = 0; j < BLOCK / 2; ++j) {
      const uint8_t* src = w + j * COLS;
      if (j % 4 == 0) _mm_prefetch((const char*)src + PREFETCH, _MM_HINT_T0);
      __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)src));
      __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, nib)), d_lo, m_lo);
      __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), d_hi, m_hi);
      _mm512_store_si512(out + j * 2 * COLS, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
};

struct Q8 {
  static constexpr int W = BLOCK * COLS, S = COLS;
  static void dequant(const uint8_t* w, const uint16_t* ds, uint16_t* out) {
    _mm_prefetch((const char*)ds + PREFETCH / 16, _MM_HINT_T0);
    __m512 d_lo, d_hi;
    spread(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)ds)), d_lo, d_hi);
    for (int j = 0; j < BLOCK / 2; ++j) {
      const uint8_t* src = w + j * 2 * COLS;
      if (j % 2 == 0) _mm_prefetch((const char*)src + PREFETCH, _MM_HINT_T0);
      __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)src)));
      __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(src + COLS))));
      __m512bh both = _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d_hi), _mm512_mul_ps(lo, d_lo));
      _mm512_store_si512(out + j * 2 * COLS, (__m512i)both);
    }
  }
};

// One row tile's products with one group of 4 dequantised panels (b: 4 x [16 k-pairs][32] bf16), into C tiles 0-3.
inline void tile_group(const uint16_t* a, int64_t lda, const uint16_t* b) {
  _tile_loadd(4, a, lda * 2);
  _tile_loadd(5, b, 64); _tile_dpbf16ps(0, 4, 5);
  _tile_loadd(6, b + 512, 64); _tile_dpbf16ps(1, 4, 6);
  _tile_loadd(7, b + 1024, 64); _tile_dpbf16ps(2, 4, 7);
  _tile_loadd(5, b + 1536, 64); _tile_dpbf16ps(3, 4, 5);
}

// C tiles 0-3 -> rows m0.. of y's 64 columns (bf16), via c [16][64] fp32.
void store_tiles(float* c, uint16_t* y, int64_t m0, int64_t M, int64_t ldy) {
  _tile_stored(0, c, 4 * COLS * 4); _tile_stored(1, c + COLS, 4 * COLS * 4);
  _tile_stored(2, c + 2 * COLS, 4 * COLS * 4); _tile_stored(3, c + 3 * COLS, 4 * COLS * 4);
  for (int64_t r = 0; r < 16 && m0 + r < M; ++r)
    for (int p = 0; p < PANELS; ++p)
      _mm256_storeu_si256((__m256i*)(y + (m0 + r) * ldy + p * COLS),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(c + r * 4 * COLS + p * COLS)));
}

// Tiles: C 0-3 (rows x 16 fp32), A 4 (rows x 32 bf16), B 5-7 (16 k-pairs x 16 columns x 2 bf16). Loading a config
// zeroes every tile.
void configure(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 5; ++t) { cfg.rows[t] = rows; cfg.colsb[t] = 64; }
  for (int t = 5; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
}

// 64 columns of y for all M rows of x: each group of the 4 panels is dequantised once into b ([G][4][16][32] bf16)
// and used at once by the first row tile (while it is in L1); further row tiles reuse b. A row tile is 16 rows, the
// last one what is left (its tiles configured to that many rows, so no padded copy of x is needed).
template <class F>
void panel_set(const uint16_t* x, int64_t M, int64_t K, const uint8_t* w, const uint16_t* scales, uint16_t* b, float* c,
               uint16_t* y, int64_t ldy) {
  const int64_t G = K / BLOCK, group = PANELS * BLOCK * COLS;
  configure((int)std::min<int64_t>(16, M));
  for (int64_t g = 0; g < G; ++g) {
    for (int p = 0; p < PANELS; ++p)
      F::dequant(w + (g * PANELS + p) * F::W, scales + (g * PANELS + p) * F::S, b + g * group + p * BLOCK * COLS);
    tile_group(x + g * BLOCK, K, b + g * group);
  }
  store_tiles(c, y, 0, M, ldy);
  for (int64_t m0 = 16; m0 < M; m0 += 16) {
    configure((int)std::min<int64_t>(16, M - m0));
    for (int64_t g = 0; g < G; ++g) tile_group(x + m0 * K + g * BLOCK, K, b + g * group);
    store_tiles(c, y, m0, M, ldy);
  }
}

// y = x @ w^T for a packed weight of format F: w [N/64, K/32, 4, F::W] bytes, scales [N/64, K/32, 4, F::S] fp16.
template <class F>
at::Tensor mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales) {
  TORCH_CHECK(amx_permitted(), "eagle3_amx: the kernel refused AMX state");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "eagle3_amx: x must be a 2-d bf16 tensor");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 4 && w.size(2) == PANELS && w.size(3) == F::W &&
              scales.scalar_type() == at::kHalf && scales.dim() == 4 && scales.size(3) == F::S,
              "eagle3_amx: w must be uint8 [N/64, K/32, 4, W], scales fp16 [N/64, K/32, 4, S]");
  const int64_t M = x.size(0), K = x.size(1), sets = w.size(0), N = sets * PANELS * COLS;
  TORCH_CHECK(w.size(1) * BLOCK == K && scales.size(0) == sets && scales.size(1) == w.size(1),
              "eagle3_amx: shapes do not match");
  auto y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  auto xc = x.contiguous();
  const auto* xp = (const uint16_t*)xc.data_ptr();
  const auto* wp = w.data_ptr<uint8_t>();
  const auto* sp = (const uint16_t*)scales.data_ptr();
  auto* yp = (uint16_t*)y.data_ptr();
  const int64_t G = K / BLOCK;
  at::parallel_for(0, sets, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<uint16_t> b;  // the panel set's dequantised blocks (L2), kept across calls
    thread_local std::vector<float> c;
    if ((int64_t)b.size() < PANELS * K * COLS + 32) b.resize(PANELS * K * COLS + 32);
    if (c.size() < 16 * PANELS * COLS) c.resize(16 * PANELS * COLS);
    uint16_t* bb = (uint16_t*)(((uintptr_t)b.data() + 63) & ~(uintptr_t)63);
    for (int64_t s = begin; s < end; ++s)
      panel_set<F>(xp, M, K, wp + s * G * PANELS * F::W, sp + s * G * PANELS * F::S, bb, c.data(),
                   yp + s * PANELS * COLS, N);
    _tile_release();
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(eagle3_amx, m) {
  m.def("q4_mm(Tensor x, Tensor w, Tensor scales) -> Tensor");
  m.def("q8_mm(Tensor x, Tensor w, Tensor scales) -> Tensor");
}
TORCH_LIBRARY_IMPL(eagle3_amx, CPU, m) {
  m.impl("q4_mm", &mm<Q4>);
  m.impl("q8_mm", &mm<Q8>);
}
