// The CPU grouped GEMM: C = A * dequant(B)^T per group, fp32 accumulation, OpenMP.
//
// The work is cut into tiles (group, rows [m0, m1), columns [n0, n1)); each tile is one
// OpenMP task computed by one thread, by one of two paths chosen by the group's row count:
//
// * Packed path (groups of more than kMaxDotRows rows; BLIS-like):
//     for each K block of kKc = 256:
//       pack:   dequant(B[g])[n0:n1, k0:k0+kc] -> fp32 panels of kNr = 16 columns, k-major
//               (panel[k][j]), decoded once per (tile, K block) and shared by all its rows
//       for each row block of Isa::kRows rows (plus one remainder block):
//         for each run of panels: micro-kernel  C[rows][cols] (+)= A[rows][k0:] * panels
//   The micro-kernel holds a kRows x (kPanels * 16) accumulator block in registers and walks
//   k in order; the first K block starts from zero and later ones reload C, so each C element
//   is the sequential sum over k = 0, 1, ..., K-1. Remainder row blocks (fewer rows) cover
//   more panels at once to keep as many independent accumulators.
//
// * Few-rows path (groups of at most kMaxDotRows rows: decode). With one row per expert there
//   is nothing to amortize a transposed copy of B over, and decoding B is the whole cost: each
//   B row is decoded in place, a vector at a time, into lane-wise partial dot products (lane l
//   sums k = l, l + W, l + 2W, ... for the vector width W), added up in a fixed order at the
//   end.
//
// Either way the summation order of an element depends on the instruction set and on whether
// its group has more than kMaxDotRows rows, never on the thread count or the tiling.
//
// The kernels use GCC/Clang vector extensions sized to the instruction set they are compiled
// for (plain loops were tried first: GCC 12 spilled part of the accumulator block and turned
// broadcasts into wide loads, at a third of the speed). Each instruction set gets its own copy
// of the tile routine through a target attribute, picked at run time; the library itself is
// built for the default x86-64 target.
#include "cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "modmoe/error.h"
#include "modmoe/numeric.h"

#if !defined(__GNUC__)
#error "src/cpu/gemm.cpp needs the GCC/Clang vector extensions (compile with GCC or Clang)"
#endif

// a * b + c must become one fused multiply-add where the instruction set has it: the build is
// ISO C++17 (-ffp-contract=off in GCC), so the tile routines ask for contraction explicitly.
#if defined(__clang__)
#pragma clang fp contract(fast)
#define MODMOE_GEMM_CONTRACT
#else
#define MODMOE_GEMM_CONTRACT optimize("fp-contract=fast")
#endif

// Everything below the per-ISA entry points is inlined into them, so it is compiled for
// their instruction set.
#define MODMOE_GEMM_INLINE inline __attribute__((always_inline))
// Left to its heuristics, GCC sometimes keeps a small loop over accumulators rolled (seen in
// the few-rows path with AVX2), and the accumulators then live in memory: 6x slower.
#define MODMOE_GEMM_UNROLL _Pragma("GCC unroll 32")

namespace modmoe {
namespace cpu {
namespace {

// ---- blocking ------------------------------------------------------------------------------

constexpr int kNr = 16;          // columns per packed panel (= one AVX-512 vector)
constexpr int64_t kKc = 256;     // K block: a 256 x 16 fp32 panel is 16 KiB, it stays in L1
constexpr int64_t kNcMax = 128;  // columns per tile: 8 panels, 128 KiB of packed B (L2)
constexpr int64_t kMcMax = 240;  // rows per tile; B is repacked once per tile and K block
constexpr int kKRun = 16;        // k elements decoded per row before the transpose
constexpr int kMaxPanels = 8;    // panels one micro-kernel call covers, at most
// Groups with at most this many rows take the few-rows path. Measured with AVX-512 on Zen 5,
// one thread: 2.5x faster than packing at 1-4 rows of bf16, 1.2x for fp8 (costlier decode);
// packing wins from about 8 rows of fp8 and 16 rows of bf16.
constexpr int kMaxDotRows = 4;
// Below this many multiply-adds a call runs on the calling thread only.
constexpr int64_t kMinParallelFma = int64_t{1} << 18;

// A run of kKRun elements never straddles a scale group: K blocks start at multiples of kKc,
// and the few-rows path's vectors (at most 16 wide) start at multiples of their width.
static_assert(kKc % kBlockSize == 0 && kBlockSize % kKRun == 0 && kMxBlockSize % kKRun == 0,
              "a decoded run must lie within one scale group");
static_assert(kMcMax % 24 == 0, "tile rows should be a multiple of every ISA's row block");

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- instruction-set profiles ----------------------------------------------------------------

// Vector width, the packed path's full row block (kRows rows x kPanels panels of accumulators)
// and the few-rows path's accumulator budget, each sized to the register file.
struct IsaGeneric {
#if defined(__aarch64__)
  static constexpr int kWidth = 4, kRows = 6, kPanels = 1;  // 24 of 32 NEON registers
  static constexpr int kDotAccumulators = 16;
#else
  static constexpr int kWidth = 4, kRows = 2, kPanels = 1;  // SSE2: 8 of 16 xmm registers
  static constexpr int kDotAccumulators = 8;
#endif
};
struct IsaAvx2 {
  static constexpr int kWidth = 8, kRows = 6, kPanels = 1;  // 12 of 16 ymm registers
  static constexpr int kDotAccumulators = 8;
};
struct IsaAvx512 {
  // 12 of 32 zmm registers; two panels keep the loads per k (2 + 6 broadcasts) under the
  // 12 FMAs (one panel of 8 rows measured 25% slower).
  static constexpr int kWidth = 16, kRows = 6, kPanels = 2;
  static constexpr int kDotAccumulators = 16;
};

// GCC/Clang vector types of kWidth lanes (one register of the ISA above: wider types are
// split badly by GCC 12).
template <int kWidth>
struct Vecs {
  typedef float f32 __attribute__((vector_size(4 * kWidth)));
  typedef int32_t i32 __attribute__((vector_size(4 * kWidth)));
  typedef uint32_t u32 __attribute__((vector_size(4 * kWidth)));
  typedef uint16_t u16 __attribute__((vector_size(2 * kWidth)));
  typedef uint8_t u8 __attribute__((vector_size(kWidth)));
};

// ---- decoding ------------------------------------------------------------------------------

struct DecodeTables {
  float e4m3[256];  // fp8 code -> value (NaN codes included)
  float e8m0[256];  // MX scale code -> 2^(code - 127)
};

const DecodeTables& decode_tables() {
  static const DecodeTables tables = [] {
    DecodeTables t;
    for (int code = 0; code < 256; ++code) {
      t.e4m3[code] = e4m3_to_float(static_cast<uint8_t>(code));
      t.e8m0[code] = e8m0_to_float(static_cast<uint8_t>(code));
    }
    return t;
  }();
  return tables;
}

template <DType kDtype>
struct Storage;
template <>
struct Storage<DType::fp32> {
  using type = float;
};
template <>
struct Storage<DType::bf16> {
  using type = uint16_t;
};
template <>
struct Storage<DType::fp16> {
  using type = uint16_t;
};
template <>
struct Storage<DType::fp8_e4m3> {
  using type = uint8_t;
};

// Decodes kWidth consecutive codes of B into fp32, times `scale` when kScaled. Integer
// operations only (plus one exact int -> float conversion for subnormals), so fp8 needs no
// table gather and fp16 no ldexp; subnormals never pass through a denormal fp32 value,
// which a flush-to-zero mode would eat.
template <int kWidth, DType kDtype, bool kScaled>
MODMOE_GEMM_INLINE void decode_vector(const typename Storage<kDtype>::type* src, float scale,
                                      float* out) {
  using V = Vecs<kWidth>;
  typename V::f32 value;
  if constexpr (kDtype == DType::fp32) {
    std::memcpy(&value, src, sizeof(value));
  } else if constexpr (kDtype == DType::bf16) {
    typename V::u16 code;
    std::memcpy(&code, src, sizeof(code));
    value = (typename V::f32)(__builtin_convertvector(code, typename V::u32) << 16);
  } else if constexpr (kDtype == DType::fp16) {
    typename V::u16 code16;
    std::memcpy(&code16, src, sizeof(code16));
    const typename V::u32 code = __builtin_convertvector(code16, typename V::u32);
    const typename V::u32 magnitude = code & 0x7fffu;
    const typename V::u32 normal = (magnitude << 13) + ((127u - 15u) << 23);  // rebias
    const typename V::u32 inf_nan = (magnitude << 13) | 0x7f800000u;
    const typename V::u32 subnormal = (typename V::u32)(
        __builtin_convertvector((typename V::i32)magnitude, typename V::f32) * 0x1p-24f);
    // Lane masks are all ones or all zeros: (a & mask) | (b & ~mask) picks a or b. (No
    // helper function: passing vectors by value draws ABI warnings outside the ISA clones.)
    const typename V::u32 special = (typename V::u32)(magnitude >= 0x7c00u);
    const typename V::u32 tiny = (typename V::u32)(magnitude < 0x0400u);
    typename V::u32 bits = (inf_nan & special) | (normal & ~special);
    bits = (subnormal & tiny) | (bits & ~tiny);
    value = (typename V::f32)(bits | ((code & 0x8000u) << 16));
  } else {
    static_assert(kDtype == DType::fp8_e4m3, "unsupported weight dtype");
    typename V::u8 code8;
    std::memcpy(&code8, src, sizeof(code8));
    // Widened in two steps: GCC 12 turns a direct u8 -> u32 conversion into scalar code.
    const typename V::u32 code =
        __builtin_convertvector(__builtin_convertvector(code8, typename V::u16), typename V::u32);
    const typename V::u32 magnitude = code & 0x7fu;
    const typename V::u32 normal = (magnitude << 20) + ((127u - 7u) << 23);  // rebias
    const typename V::u32 subnormal = (typename V::u32)(
        __builtin_convertvector((typename V::i32)magnitude, typename V::f32) * 0x1p-9f);
    const typename V::u32 tiny = (typename V::u32)(magnitude < 0x08u);
    const typename V::u32 nan = (typename V::u32)(magnitude == 0x7fu);
    typename V::u32 bits = (subnormal & tiny) | (normal & ~tiny);
    bits = (nan & 0x7fc00000u) | (bits & ~nan);
    value = (typename V::f32)(bits | ((code & 0x80u) << 24));
  }
  if constexpr (kScaled) value *= scale;
  std::memcpy(out, &value, sizeof(value));
}

// One element, for the K tail (rare: clarity over speed).
template <DType kDtype>
MODMOE_GEMM_INLINE float decode_scalar(typename Storage<kDtype>::type code, const DecodeTables& t) {
  if constexpr (kDtype == DType::fp32) {
    return code;
  } else if constexpr (kDtype == DType::bf16) {
    return bf16_to_float(code);
  } else if constexpr (kDtype == DType::fp16) {
    return fp16_to_float(code);
  } else {
    return t.e4m3[code];
  }
}

// The scale of dequant(B)[n][k] (quant.h layouts, already offset to this expert).
template <QuantScheme kScheme>
MODMOE_GEMM_INLINE float scale_at(const WeightOperand& b, int64_t n, int64_t k,
                                  const DecodeTables& t) {
  if constexpr (kScheme == QuantScheme::none) {
    return 1.0f;
  } else if constexpr (kScheme == QuantScheme::fp8_tensor) {
    return static_cast<const float*>(b.scale)[0];
  } else if constexpr (kScheme == QuantScheme::fp8_token) {
    return static_cast<const float*>(b.scale)[n];
  } else if constexpr (kScheme == QuantScheme::fp8_block) {
    return static_cast<const float*>(
        b.scale)[(n / kBlockSize) * ceil_div(b.K, kBlockSize) + k / kBlockSize];
  } else {
    return t.e8m0[static_cast<const uint8_t*>(
        b.scale)[n * ceil_div(b.K, kMxBlockSize) + k / kMxBlockSize]];
  }
}

// Calls f.run<kDtype, kScheme>() for the format of b (validated beforehand).
template <typename F>
MODMOE_GEMM_INLINE void with_format(const WeightOperand& b, F&& f) {
  constexpr DType kFp8 = DType::fp8_e4m3;
  constexpr QuantScheme kNone = QuantScheme::none;
  switch (b.dtype) {
    case DType::fp32:
      return f.template run<DType::fp32, kNone>();
    case DType::bf16:
      return f.template run<DType::bf16, kNone>();
    case DType::fp16:
      return f.template run<DType::fp16, kNone>();
    default:
      break;
  }
  switch (b.scheme) {
    case QuantScheme::fp8_tensor:
      return f.template run<kFp8, QuantScheme::fp8_tensor>();
    case QuantScheme::fp8_token:
      return f.template run<kFp8, QuantScheme::fp8_token>();
    case QuantScheme::fp8_block:
      return f.template run<kFp8, QuantScheme::fp8_block>();
    case QuantScheme::mxfp8:
      return f.template run<kFp8, QuantScheme::mxfp8>();
    case QuantScheme::none:
      break;  // rejected by validation
  }
}

// ---- tiles -----------------------------------------------------------------------------------

struct Tile {
  int64_t group, m_begin, m_end, n_begin, n_end;
  bool few_rows;  // the group has at most kMaxDotRows rows
};

struct Problem {
  const float* A;
  int64_t lda;
  const WeightOperand* B;
  float* C;
  int64_t ldc;
  const DecodeTables* tables;
};

// ---- the few-rows path (decode) ------------------------------------------------------------

// Sum of a vector's lanes in a fixed pairwise order.
template <int kWidth, typename Vec>
MODMOE_GEMM_INLINE float sum_lanes(const Vec& v) {
  float lanes[kWidth];
  std::memcpy(lanes, &v, sizeof(lanes));
  for (int width = kWidth / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// C[kRows][n0:n1] = A[kRows][:] * dequant(B)[n0:n1][:]^T, B decoded in place (no packing).
template <class Isa, DType kDtype, QuantScheme kScheme, int kRows>
MODMOE_GEMM_INLINE void dot_tile(const Problem& pr, const Tile& tile) {
  constexpr int kWidth = Isa::kWidth;
  using Vec = typename Vecs<kWidth>::f32;
  using Code = typename Storage<kDtype>::type;
  constexpr bool kScaled = kScheme != QuantScheme::none;
  // B rows decoded together: independent accumulator chains, within the register budget.
  constexpr int kRowsOfB = std::max(1, std::min(4, Isa::kDotAccumulators / kRows));
  const WeightOperand& b = pr.B[tile.group];
  const DecodeTables& t = *pr.tables;
  const Code* data = static_cast<const Code*>(b.data);
  const float* a = pr.A + tile.m_begin * pr.lda;
  float* c = pr.C + tile.m_begin * pr.ldc;
  const int64_t k_vec = b.K / kWidth * kWidth;  // full vectors; the rest is the tail
  // A's tail, zero-padded to a full vector (A is never read past K).
  Vec a_tail[kRows];
  MODMOE_GEMM_UNROLL
  for (int r = 0; r < kRows; ++r) {
    float lanes[kWidth] = {};
    for (int64_t k = k_vec; k < b.K; ++k) lanes[k - k_vec] = a[r * pr.lda + k];
    std::memcpy(&a_tail[r], lanes, sizeof(Vec));
  }
  for (int64_t n0 = tile.n_begin; n0 < tile.n_end; n0 += kRowsOfB) {
    const int64_t count = std::min<int64_t>(kRowsOfB, tile.n_end - n0);
    int64_t row[kRowsOfB];  // past the end: repeat the last row, results dropped
    MODMOE_GEMM_UNROLL
    for (int q = 0; q < kRowsOfB; ++q) row[q] = n0 + std::min<int64_t>(q, count - 1);
    Vec acc[kRows][kRowsOfB];
    MODMOE_GEMM_UNROLL
    for (int r = 0; r < kRows; ++r) {
      MODMOE_GEMM_UNROLL
      for (int q = 0; q < kRowsOfB; ++q) acc[r][q] = Vec{};
    }
    for (int64_t k = 0; k < k_vec; k += kWidth) {
      Vec av[kRows];
      MODMOE_GEMM_UNROLL
      for (int r = 0; r < kRows; ++r) std::memcpy(&av[r], a + r * pr.lda + k, sizeof(Vec));
      MODMOE_GEMM_UNROLL
      for (int q = 0; q < kRowsOfB; ++q) {
        float lanes[kWidth];
        decode_vector<kWidth, kDtype, kScaled>(data + row[q] * b.row_stride + k,
                                               scale_at<kScheme>(b, row[q], k, t), lanes);
        Vec bv;
        std::memcpy(&bv, lanes, sizeof(Vec));
        MODMOE_GEMM_UNROLL
        for (int r = 0; r < kRows; ++r) acc[r][q] = bv * av[r] + acc[r][q];
      }
    }
    if (k_vec < b.K) {
      MODMOE_GEMM_UNROLL
      for (int q = 0; q < kRowsOfB; ++q) {
        float lanes[kWidth] = {};
        for (int64_t k = k_vec; k < b.K; ++k) {
          float v = decode_scalar<kDtype>(data[row[q] * b.row_stride + k], t);
          if (kScaled) v *= scale_at<kScheme>(b, row[q], k, t);
          lanes[k - k_vec] = v;
        }
        Vec bv;
        std::memcpy(&bv, lanes, sizeof(Vec));
        MODMOE_GEMM_UNROLL
        for (int r = 0; r < kRows; ++r) acc[r][q] = bv * a_tail[r] + acc[r][q];
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int q = 0; q < count; ++q) c[r * pr.ldc + n0 + q] = sum_lanes<kWidth>(acc[r][q]);
    }
  }
}

// Picks the dot_tile instantiation for `rows` (1..kRows).
template <class Isa, DType kDtype, QuantScheme kScheme, int kRows>
MODMOE_GEMM_INLINE void dot_tile_rows(int64_t rows, const Problem& pr, const Tile& tile) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return dot_tile<Isa, kDtype, kScheme, kRows>(pr, tile);
    dot_tile_rows<Isa, kDtype, kScheme, kRows - 1>(rows, pr, tile);
  }
}

// ---- the packed path -----------------------------------------------------------------------

// Packs dequant(B)[n_begin:n_end, k0:k0+kc] into panels of kNr columns:
//   out[p * kc * kNr + k * kNr + j] = dequant(B)[n_begin + p * kNr + j][k0 + k]
// Rows past n_end are zero, so the micro-kernel always runs full width. Each row is decoded
// kKRun elements at a time into a small block (contiguous, vectorized), then transposed.
template <class Isa, DType kDtype, QuantScheme kScheme>
MODMOE_GEMM_INLINE void pack_panels(const WeightOperand& b, int64_t n_begin, int64_t n_end,
                                    int64_t k0, int64_t kc, const DecodeTables& t, float* out) {
  using Code = typename Storage<kDtype>::type;
  constexpr bool kScaled = kScheme != QuantScheme::none;
  const Code* data = static_cast<const Code*>(b.data);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kNr) {
    const int rows = static_cast<int>(std::min<int64_t>(kNr, n_end - n0));
    float* panel = out + (n0 - n_begin) * kc;  // (n0 - n_begin) / kNr panels of kc * kNr
    int64_t k = 0;
    for (; k + kKRun <= kc; k += kKRun) {
      float block[kNr][kKRun];
      for (int j = 0; j < rows; ++j) {
        const Code* src = data + (n0 + j) * b.row_stride + k0 + k;
        const float scale = scale_at<kScheme>(b, n0 + j, k0 + k, t);
        for (int l = 0; l < kKRun; l += Isa::kWidth) {
          decode_vector<Isa::kWidth, kDtype, kScaled>(src + l, scale, block[j] + l);
        }
      }
      for (int j = rows; j < kNr; ++j) std::fill_n(block[j], kKRun, 0.0f);
      for (int l = 0; l < kKRun; ++l) {
        for (int j = 0; j < kNr; ++j) panel[(k + l) * kNr + j] = block[j][l];
      }
    }
    for (; k < kc; ++k) {  // the last K % kKRun columns of B
      for (int j = 0; j < kNr; ++j) {
        float v = 0.0f;
        if (j < rows) {
          v = decode_scalar<kDtype>(data[(n0 + j) * b.row_stride + k0 + k], t);
          if (kScaled) v *= scale_at<kScheme>(b, n0 + j, k0 + k, t);
        }
        panel[k * kNr + j] = v;
      }
    }
  }
}

// C[0:kRows][0:cols] (+)= A[0:kRows][0:kc] * panels, for kPanels consecutive panels
// (panel p at b + p * panel_stride). cols < kPanels * kNr only for the tile's last panel.
// accumulate = false starts from zero (first K block), true continues from C.
template <class Isa, int kRows, int kPanels>
MODMOE_GEMM_INLINE void micro_kernel(const float* a, int64_t lda, const float* b,
                                     int64_t panel_stride, int64_t kc, float* c, int64_t ldc,
                                     int64_t cols, bool accumulate) {
  using Vec = typename Vecs<Isa::kWidth>::f32;
  constexpr int kVecsPerPanel = kNr / Isa::kWidth;
  constexpr int kVecs = kPanels * kVecsPerPanel;  // accumulators per row
  constexpr int kCols = kPanels * kNr;
  const bool full = cols == kCols;

  Vec acc[kRows][kVecs];
  for (int i = 0; i < kRows; ++i) {
    float staged[kCols] = {};
    const float* src = c + i * ldc;
    if (accumulate && !full) {
      std::memcpy(staged, src, cols * sizeof(float));
      src = staged;
    }
    for (int v = 0; v < kVecs; ++v) {
      if (accumulate) {
        std::memcpy(&acc[i][v], src + v * Isa::kWidth, sizeof(Vec));
      } else {
        acc[i][v] = Vec{};
      }
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    Vec bk[kVecs];
    for (int p = 0; p < kPanels; ++p) {
      for (int v = 0; v < kVecsPerPanel; ++v) {
        std::memcpy(&bk[p * kVecsPerPanel + v], b + p * panel_stride + k * kNr + v * Isa::kWidth,
                    sizeof(Vec));
      }
    }
    for (int i = 0; i < kRows; ++i) {
      const float ai = a[i * lda + k];
      for (int v = 0; v < kVecs; ++v) acc[i][v] = bk[v] * ai + acc[i][v];
    }
  }
  for (int i = 0; i < kRows; ++i) {
    if (full) {
      for (int v = 0; v < kVecs; ++v) {
        std::memcpy(c + i * ldc + v * Isa::kWidth, &acc[i][v], sizeof(Vec));
      }
    } else {
      float staged[kCols];
      for (int v = 0; v < kVecs; ++v) {
        std::memcpy(staged + v * Isa::kWidth, &acc[i][v], sizeof(Vec));
      }
      std::memcpy(c + i * ldc, staged, cols * sizeof(float));
    }
  }
}

// kRows rows of A against all `panels` packed panels (cols valid columns in total).
template <class Isa, int kRows>
MODMOE_GEMM_INLINE void row_block(const float* a, int64_t lda, const float* packed, int64_t panels,
                                  int64_t kc, float* c, int64_t ldc, int64_t cols,
                                  bool accumulate) {
  // Fewer rows -> more panels at once, keeping about Isa::kRows * Isa::kPanels accumulators.
  constexpr int kWide = std::max(1, std::min(kMaxPanels, Isa::kRows * Isa::kPanels / kRows));
  constexpr int kPanels = kRows == Isa::kRows ? Isa::kPanels : kWide;
  const int64_t panel_stride = kc * kNr;
  int64_t p = 0;
  for (; p + kPanels <= panels; p += kPanels) {
    micro_kernel<Isa, kRows, kPanels>(a, lda, packed + p * panel_stride, panel_stride, kc,
                                      c + p * kNr, ldc,
                                      std::min<int64_t>(cols - p * kNr, kPanels * kNr), accumulate);
  }
  for (; p < panels; ++p) {
    micro_kernel<Isa, kRows, 1>(a, lda, packed + p * panel_stride, panel_stride, kc, c + p * kNr,
                                ldc, std::min<int64_t>(cols - p * kNr, kNr), accumulate);
  }
}

// Picks the row_block instantiation for the last `rows` (< Isa::kRows) rows.
template <class Isa, int kRows>
MODMOE_GEMM_INLINE void remainder_rows(int64_t rows, const float* a, int64_t lda,
                                       const float* packed, int64_t panels, int64_t kc, float* c,
                                       int64_t ldc, int64_t cols, bool accumulate) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      return row_block<Isa, kRows>(a, lda, packed, panels, kc, c, ldc, cols, accumulate);
    }
    remainder_rows<Isa, kRows - 1>(rows, a, lda, packed, panels, kc, c, ldc, cols, accumulate);
  }
}

// ---- one tile ------------------------------------------------------------------------------

template <class Isa>
struct PackPanels {
  const WeightOperand& b;
  int64_t n_begin, n_end, k0, kc;
  const DecodeTables& t;
  float* out;
  template <DType kDtype, QuantScheme kScheme>
  MODMOE_GEMM_INLINE void run() {
    pack_panels<Isa, kDtype, kScheme>(b, n_begin, n_end, k0, kc, t, out);
  }
};

template <class Isa>
struct DotTile {
  const Problem& pr;
  const Tile& tile;
  template <DType kDtype, QuantScheme kScheme>
  MODMOE_GEMM_INLINE void run() {
    dot_tile_rows<Isa, kDtype, kScheme, kMaxDotRows>(tile.m_end - tile.m_begin, pr, tile);
  }
};

// `packed` holds kKc * kNcMax floats (unused by the few-rows path).
template <class Isa>
MODMOE_GEMM_INLINE void run_tile(const Problem& pr, const Tile& tile, float* packed) {
  const WeightOperand& b = pr.B[tile.group];
  const int64_t cols = tile.n_end - tile.n_begin;
  if (b.K == 0) {  // an empty sum
    for (int64_t m = tile.m_begin; m < tile.m_end; ++m) {
      std::fill_n(pr.C + m * pr.ldc + tile.n_begin, cols, 0.0f);
    }
    return;
  }
  if (tile.few_rows) return with_format(b, DotTile<Isa>{pr, tile});
  const int64_t panels = ceil_div(cols, kNr);
  for (int64_t k0 = 0; k0 < b.K; k0 += kKc) {
    const int64_t kc = std::min(kKc, b.K - k0);
    with_format(b, PackPanels<Isa>{b, tile.n_begin, tile.n_end, k0, kc, *pr.tables, packed});
    const bool accumulate = k0 > 0;
    int64_t m = tile.m_begin;
    for (; m + Isa::kRows <= tile.m_end; m += Isa::kRows) {
      row_block<Isa, Isa::kRows>(pr.A + m * pr.lda + k0, pr.lda, packed, panels, kc,
                                 pr.C + m * pr.ldc + tile.n_begin, pr.ldc, cols, accumulate);
    }
    remainder_rows<Isa, Isa::kRows - 1>(tile.m_end - m, pr.A + m * pr.lda + k0, pr.lda, packed,
                                        panels, kc, pr.C + m * pr.ldc + tile.n_begin, pr.ldc, cols,
                                        accumulate);
  }
}

// One compiled copy of the tile routine per instruction set.
using TileFn = void (*)(const Problem&, const Tile&, float*);

__attribute__((MODMOE_GEMM_CONTRACT)) void run_tile_generic(const Problem& pr, const Tile& tile,
                                                            float* packed) {
  run_tile<IsaGeneric>(pr, tile, packed);
}

#if defined(__x86_64__)
#define MODMOE_GEMM_X86 1
__attribute__((target("avx2,fma"), MODMOE_GEMM_CONTRACT)) void run_tile_avx2(const Problem& pr,
                                                                             const Tile& tile,
                                                                             float* packed) {
  run_tile<IsaAvx2>(pr, tile, packed);
}
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"), MODMOE_GEMM_CONTRACT)) void
run_tile_avx512(const Problem& pr, const Tile& tile, float* packed) {
  run_tile<IsaAvx512>(pr, tile, packed);
}
#else
#define MODMOE_GEMM_X86 0
#endif

// ---- instruction-set choice ----------------------------------------------------------------

enum class IsaLevel { generic = 0, avx2 = 1, avx512 = 2 };

IsaLevel cpu_isa_level() {
  static const IsaLevel level = [] {
#if MODMOE_GEMM_X86
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq");
    if (avx512) return IsaLevel::avx512;
    if (avx2) return IsaLevel::avx2;
#endif
    return IsaLevel::generic;
  }();
  return level;
}

// The CPU's best, capped by MODMOE_CPU_GEMM_ISA (read on every call so tests can switch).
TileFn select_tile_fn(const char* fn) {
  IsaLevel level = cpu_isa_level();
  if (const char* env = std::getenv("MODMOE_CPU_GEMM_ISA")) {
    const std::string want(env);
    IsaLevel cap = IsaLevel::avx512;
    if (want == "generic") {
      cap = IsaLevel::generic;
    } else if (want == "avx2") {
      cap = IsaLevel::avx2;
    } else {
      MODMOE_CHECK(want == "avx512" || want == "auto" || want.empty())
          << fn << ": MODMOE_CPU_GEMM_ISA must be avx512, avx2, generic or auto, got '" << want
          << "'";
    }
    level = std::min(level, cap);
  }
#if MODMOE_GEMM_X86
  if (level == IsaLevel::avx512) return run_tile_avx512;
  if (level == IsaLevel::avx2) return run_tile_avx2;
#endif
  return run_tile_generic;
}

// ---- per-thread pack buffer ----------------------------------------------------------------

// kKc * kNcMax floats (128 KiB) per thread, kept for the thread's lifetime: a decode step
// calls the GEMM twice per layer, and a fresh buffer each time would pay page faults.
float* thread_pack_buffer() {
  struct Buffer {
    float* data = nullptr;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffer;
  if (buffer.data == nullptr) {
    buffer.data = static_cast<float*>(std::aligned_alloc(64, kKc * kNcMax * sizeof(float)));
    if (buffer.data == nullptr) std::abort();  // cannot throw out of an OpenMP region
  }
  return buffer.data;
}

// ---- tiling --------------------------------------------------------------------------------

// Cuts every non-empty group into tiles. Columns per tile start at kNcMax and halve (down to
// one panel) until there are a few tiles per thread, so one-group prefill and one-row decode
// both spread over the threads. (The results do not depend on the tiling.)
std::vector<Tile> plan_tiles(int64_t num_groups, const int64_t* row_offsets, const WeightOperand* B,
                             int threads) {
  const int64_t wanted = 4 * static_cast<int64_t>(threads);
  int64_t nc = kNcMax;
  for (;;) {
    int64_t count = 0;
    for (int64_t g = 0; g < num_groups; ++g) {
      const int64_t rows = row_offsets[g + 1] - row_offsets[g];
      if (rows > 0) count += ceil_div(rows, kMcMax) * ceil_div(B[g].N, nc);
    }
    if (count >= wanted || nc <= kNr) break;
    nc /= 2;
  }
  std::vector<Tile> tiles;
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t m_begin = row_offsets[g], rows = row_offsets[g + 1] - m_begin;
    if (rows <= 0) continue;
    // Equal row chunks (rounded up to 24 rows) rather than kMcMax rows plus a sliver.
    const int64_t chunks = ceil_div(rows, kMcMax);
    const int64_t chunk = std::min(kMcMax, ceil_div(ceil_div(rows, chunks), 24) * 24);
    for (int64_t m = 0; m < rows; m += chunk) {
      for (int64_t n = 0; n < B[g].N; n += nc) {
        tiles.push_back({g, m_begin + m, m_begin + std::min(rows, m + chunk), n,
                         std::min(B[g].N, n + nc), rows <= kMaxDotRows});
      }
    }
  }
  return tiles;
}

// ---- validation ----------------------------------------------------------------------------

bool is_supported_weight_dtype(DType d) {
  return d == DType::bf16 || d == DType::fp16 || d == DType::fp32 || d == DType::fp8_e4m3;
}

// `name` is "B" or "B[g]"; `rows` the rows of the group that uses it.
void validate_operand(const char* fn, const std::string& name, const WeightOperand& b, int64_t rows,
                      int64_t lda, int64_t ldc) {
  MODMOE_CHECK(b.data != nullptr) << fn << ": " << name << ".data must not be null (its group has "
                                  << rows << " rows)";
  MODMOE_CHECK(is_supported_weight_dtype(b.dtype))
      << fn << ": " << name << ".dtype must be bf16, fp16, fp32 or fp8_e4m3, got "
      << dtype_name(b.dtype);
  MODMOE_CHECK(b.N >= 0 && b.K >= 0)
      << fn << ": " << name << " must have N >= 0 and K >= 0, got (N, K) = (" << b.N << ", " << b.K
      << ")";
  MODMOE_CHECK(b.row_stride >= b.K)
      << fn << ": " << name << ".row_stride must be >= K = " << b.K << ", got " << b.row_stride;
  if (b.dtype == DType::fp8_e4m3) {
    MODMOE_CHECK(b.scheme != QuantScheme::none)
        << fn << ": " << name
        << ".scheme must be fp8-tensor, fp8-token, fp8-block or mxfp8 for fp8_e4m3 weights, got "
        << quant_scheme_name(b.scheme);
    MODMOE_CHECK(b.scale != nullptr) << fn << ": " << name << ".scale must not be null for "
                                     << quant_scheme_name(b.scheme) << " weights";
  } else {
    MODMOE_CHECK(b.scheme == QuantScheme::none)
        << fn << ": " << name << ".scheme must be none for " << dtype_name(b.dtype)
        << " weights, got " << quant_scheme_name(b.scheme);
  }
  MODMOE_CHECK(lda >= b.K) << fn << ": lda must be >= " << name << ".K = " << b.K << ", got "
                           << lda;
  MODMOE_CHECK(ldc >= b.N) << fn << ": ldc must be >= " << name << ".N = " << b.N << ", got "
                           << ldc;
}

void validate(const char* fn, int64_t num_groups, const int64_t* row_offsets, const float* A,
              int64_t lda, const WeightOperand* B, const float* C, int64_t ldc, bool single) {
  MODMOE_CHECK(num_groups >= 0) << fn << ": num_groups must be >= 0, got " << num_groups;
  if (num_groups == 0) return;
  MODMOE_CHECK(row_offsets != nullptr) << fn << ": row_offsets must not be null";
  MODMOE_CHECK(B != nullptr) << fn << ": B must not be null";
  MODMOE_CHECK(row_offsets[0] >= 0)
      << fn << ": row_offsets[0] must be >= 0, got " << row_offsets[0];
  bool any_rows = false;
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t rows = row_offsets[g + 1] - row_offsets[g];
    MODMOE_CHECK(rows >= 0) << fn << ": row_offsets must be non-decreasing, got row_offsets[" << g
                            << "] = " << row_offsets[g] << " > row_offsets[" << g + 1
                            << "] = " << row_offsets[g + 1];
    if (rows == 0) continue;  // never touched, so not checked either
    any_rows = true;
    validate_operand(fn, single ? std::string("B") : "B[" + std::to_string(g) + "]", B[g], rows,
                     lda, ldc);
  }
  if (any_rows) {
    MODMOE_CHECK(A != nullptr) << fn << ": A must not be null";
    MODMOE_CHECK(C != nullptr) << fn << ": C must not be null";
  }
}

void run(const char* fn, int64_t num_groups, const int64_t* row_offsets, const float* A,
         int64_t lda, const WeightOperand* B, float* C, int64_t ldc) {
  const TileFn tile_fn = select_tile_fn(fn);
  if (num_groups == 0) return;
  int64_t fma_count = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t rows = row_offsets[g + 1] - row_offsets[g];
    if (rows > 0) fma_count += rows * B[g].N * std::max<int64_t>(B[g].K, 1);
  }
  if (fma_count == 0) return;
  const bool parallel = fma_count >= kMinParallelFma;
  const std::vector<Tile> tiles =
      plan_tiles(num_groups, row_offsets, B, parallel ? omp_get_max_threads() : 1);
  const Problem problem{A, lda, B, C, ldc, &decode_tables()};
  const int64_t count = static_cast<int64_t>(tiles.size());
  // Dynamic scheduling balances groups of different sizes; any thread may take any tile, and
  // a tile's result does not depend on who computes it.
#pragma omp parallel for schedule(dynamic, 1) if (parallel && count > 1)
  for (int64_t t = 0; t < count; ++t) tile_fn(problem, tiles[t], thread_pack_buffer());
}

}  // namespace

void grouped_gemm_nt(int64_t num_groups, const int64_t* row_offsets, const float* A, int64_t lda,
                     const WeightOperand* B, float* C, int64_t ldc) {
  constexpr const char* kFn = "grouped_gemm_nt";
  validate(kFn, num_groups, row_offsets, A, lda, B, C, ldc, /*single=*/false);
  run(kFn, num_groups, row_offsets, A, lda, B, C, ldc);
}

void gemm_nt(int64_t M, const float* A, int64_t lda, const WeightOperand& B, float* C,
             int64_t ldc) {
  constexpr const char* kFn = "gemm_nt";
  MODMOE_CHECK(M >= 0) << kFn << ": M must be >= 0, got " << M;
  const int64_t row_offsets[2] = {0, M};
  validate(kFn, 1, row_offsets, A, lda, &B, C, ldc, /*single=*/true);
  run(kFn, 1, row_offsets, A, lda, &B, C, ldc);
}

}  // namespace cpu
}  // namespace modmoe
