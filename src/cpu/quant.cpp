// CPU quantize / dequantize of activations (M, K) and expert weights (E, N, K) to fp8 e4m3
// (quant.h), OpenMP-parallel over rows, built on the row helpers of quant_rows.h. The public
// functions of quant.h dispatch here for CPU contexts (src/ops.cpp).
#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/op_checks.h"
#include "cpu/quant_rows.h"
#include "modmoe/error.h"
#include "modmoe/numeric.h"

namespace modmoe {
namespace cpu {

void quantize_row(const float* x, int64_t K, QuantScheme scheme, const float* tensor_scale,
                  uint8_t* q, void* row_scale) {
  switch (scheme) {
    case QuantScheme::fp8_tensor:
      quantize_span(x, K, *tensor_scale, q);
      return;
    case QuantScheme::fp8_token: {
      const float scale = fp8_scale_for_amax(amax_of(x, K));
      static_cast<float*>(row_scale)[0] = scale;
      quantize_span(x, K, scale, q);
      return;
    }
    case QuantScheme::fp8_block: {
      float* scales = static_cast<float*>(row_scale);
      for (int64_t k0 = 0, g = 0; k0 < K; k0 += kBlockSize, ++g) {
        const int64_t n = std::min(kBlockSize, K - k0);
        scales[g] = fp8_scale_for_amax(amax_of(x + k0, n));
        quantize_span(x + k0, n, scales[g], q + k0);
      }
      return;
    }
    case QuantScheme::mxfp8: {
      uint8_t* codes = static_cast<uint8_t*>(row_scale);
      for (int64_t k0 = 0, g = 0; k0 < K; k0 += kMxBlockSize, ++g) {
        const int64_t n = std::min(kMxBlockSize, K - k0);
        codes[g] = mx_scale_code_for_amax(amax_of(x + k0, n));
        quantize_span(x + k0, n, e8m0_value(codes[g]), q + k0);
      }
      return;
    }
    case QuantScheme::none:
      break;
  }
  MODMOE_FAIL() << "cpu::quantize_row: scheme must be a quantized scheme, got "
                << quant_scheme_name(scheme);
}

void dequantize_row(const uint8_t* q, int64_t K, QuantScheme scheme, const void* row_scale,
                    float* out) {
  switch (scheme) {
    case QuantScheme::fp8_tensor:
    case QuantScheme::fp8_token:
      dequantize_span(q, K, static_cast<const float*>(row_scale)[0], out);
      return;
    case QuantScheme::fp8_block: {
      const float* scales = static_cast<const float*>(row_scale);
      for (int64_t k0 = 0, g = 0; k0 < K; k0 += kBlockSize, ++g)
        dequantize_span(q + k0, std::min(kBlockSize, K - k0), scales[g], out + k0);
      return;
    }
    case QuantScheme::mxfp8: {
      const uint8_t* codes = static_cast<const uint8_t*>(row_scale);
      for (int64_t k0 = 0, g = 0; k0 < K; k0 += kMxBlockSize, ++g)
        dequantize_span(q + k0, std::min(kMxBlockSize, K - k0), e8m0_value(codes[g]), out + k0);
      return;
    }
    case QuantScheme::none:
      break;
  }
  MODMOE_FAIL() << "cpu::dequantize_row: scheme must be a quantized scheme, got "
                << quant_scheme_name(scheme);
}

}  // namespace cpu

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- validation (the shared checks live in core/op_checks.h) ------------------------------

void check_context(const char* fn, const Context& ctx) {
  MODMOE_CHECK(ctx.device.is_cpu())
      << fn << ": ctx.device must be cpu (this is the CPU implementation), got "
      << ctx.device.str();
}

std::string weight_context(QuantScheme scheme, int64_t E, int64_t N, int64_t K) {
  return std::string(quant_scheme_name(scheme)) + " with (E, N, K) = (" + std::to_string(E) + ", " +
         std::to_string(N) + ", " + std::to_string(K) + ")";
}

// ---- row I/O -----------------------------------------------------------------------------

// Row `row` (n elements) of a contiguous float tensor as fp32: the row itself for fp32,
// else converted into `buffer`.
const float* load_row(const Tensor& t, int64_t row, int64_t n, float* buffer) {
  const int64_t offset = row * n;
  switch (t.dtype()) {
    case DType::fp32:
      return t.data_ptr<const float>() + offset;
    case DType::bf16: {
      const uint16_t* src = t.data_ptr<const uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) buffer[i] = bf16_to_float(src[i]);
      return buffer;
    }
    default: {  // fp16 (validated)
      const uint16_t* src = t.data_ptr<const uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) buffer[i] = fp16_to_float(src[i]);
      return buffer;
    }
  }
}

// The fp32 destination for row `row` of `t`: the row itself for fp32, else `buffer` (then
// call store_row).
float* row_target(const Tensor& t, int64_t row, int64_t n, float* buffer) {
  return t.dtype() == DType::fp32 ? t.data_ptr<float>() + row * n : buffer;
}

void store_row(const Tensor& t, int64_t row, int64_t n, const float* values) {
  uint16_t* dst = t.data_ptr<uint16_t>() + row * n;
  switch (t.dtype()) {
    case DType::fp32:
      return;  // written in place by row_target
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(values[i]);
      return;
    default:
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(values[i]);
      return;
  }
}

// amax of each of `rows` rows of length n, in parallel.
std::vector<float> row_amaxes(const Tensor& t, int64_t rows, int64_t n) {
  std::vector<float> amax(static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) amax[r] = cpu::amax_of(load_row(t, r, n, buffer.data()), n);
  }
  return amax;
}

// Quantizes `rows` rows of length n, where row r uses quantize_row with tensor scale
// tensor_scales[r / rows_per_scale] (fp8_tensor) or writes its own scales at
// row_scales + r * scales_per_row (other schemes).
void quantize_rows(const Tensor& x, int64_t rows, int64_t n, QuantScheme scheme,
                   const float* tensor_scales, int64_t rows_per_scale, uint8_t* q,
                   uint8_t* row_scales, int64_t scale_bytes_per_row) {
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* tensor_scale =
          scheme == QuantScheme::fp8_tensor ? tensor_scales + r / rows_per_scale : nullptr;
      cpu::quantize_row(load_row(x, r, n, buffer.data()), n, scheme, tensor_scale, q + r * n,
                        row_scales ? row_scales + r * scale_bytes_per_row : nullptr);
    }
  }
}

// Per-tensor dynamic scales: amax over each run of `rows_per_scale` rows.
void per_tensor_scales(const Tensor& x, int64_t groups, int64_t rows_per_scale, int64_t n,
                       float* scales) {
  const std::vector<float> amax = row_amaxes(x, groups * rows_per_scale, n);
  for (int64_t g = 0; g < groups; ++g) {
    float group_amax = 0.0f;
    for (int64_t r = 0; r < rows_per_scale; ++r)
      group_amax = cpu::amax_combine(group_amax, amax[g * rows_per_scale + r]);
    scales[g] = cpu::fp8_scale_for_amax(group_amax);
  }
}

}  // namespace

// ---- activations -------------------------------------------------------------------------

namespace cpu {

void quantize_activations(const Context& ctx, const Tensor& x, QuantScheme scheme,
                          bool static_scale, const Tensor& q, const Tensor& scale) {
  constexpr const char* fn = "quantize_activations";
  check_context(fn, ctx);
  check_quantize_activations_args(fn, x, scheme, static_scale, q, scale, ctx.device);
  const int64_t M = x.size(0), K = x.size(1);

  uint8_t* q_data = q.data_ptr<uint8_t>();
  if (scheme == QuantScheme::fp8_tensor) {
    float* tensor_scale = scale.data_ptr<float>();
    if (static_scale) {
      const float s = *tensor_scale;
      MODMOE_CHECK(std::isfinite(s) && s > 0.0f)
          << fn << ": the static scale must be finite and > 0, got " << s;
    } else {
      // amax over the whole tensor first; M = 0 gives amax 0 and scale 1.
      per_tensor_scales(x, 1, M, K, tensor_scale);
    }
    quantize_rows(x, M, K, scheme, tensor_scale, std::max<int64_t>(M, 1), q_data, nullptr, 0);
    return;
  }
  // fp8_token: (M, 1), fp8_block: (M, ceil(K/128)) fp32; mxfp8: (M, ceil(K/32)) e8m0 bytes.
  const int64_t scale_bytes_per_row =
      act_scale_shape(scheme, M, K)[1] * static_cast<int64_t>(dtype_size(scale_dtype(scheme)));
  quantize_rows(x, M, K, scheme, nullptr, 1, q_data, scale.data_ptr<uint8_t>(),
                scale_bytes_per_row);
}

void dequantize_activations(const Context& ctx, const Tensor& q, const Tensor& scale,
                            QuantScheme scheme, const Tensor& out) {
  constexpr const char* fn = "dequantize_activations";
  check_context(fn, ctx);
  check_dequantize_activations_args(fn, q, scale, scheme, out, ctx.device);
  const int64_t M = out.size(0), K = out.size(1);

  const uint8_t* q_data = q.data_ptr<const uint8_t>();
  const uint8_t* scale_data = scale.data_ptr<const uint8_t>();
  // fp8_tensor: every row reads the one scale (stride 0).
  const int64_t scale_bytes_per_row =
      scheme == QuantScheme::fp8_tensor
          ? 0
          : act_scale_shape(scheme, M, K)[1] * static_cast<int64_t>(dtype_size(scale.dtype()));
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      float* target = row_target(out, m, K, buffer.data());
      cpu::dequantize_row(q_data + m * K, K, scheme, scale_data + m * scale_bytes_per_row, target);
      store_row(out, m, K, target);
    }
  }
}

}  // namespace cpu

// ---- weights -----------------------------------------------------------------------------

namespace {

// fp8_block weights: one scale per 128x128 block (E, ceil(N/128), ceil(K/128)); the block
// scale maps the block's amax to 448. Parallel over (expert, row block).
void quantize_weight_blocks(const Tensor& w, int64_t E, int64_t N, int64_t K, uint8_t* q,
                            float* scales) {
  const int64_t row_blocks = ceil_div(N, kBlockSize), col_blocks = ceil_div(K, kBlockSize);
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(K));
    std::vector<float> block_amax(static_cast<size_t>(col_blocks));
#pragma omp for schedule(static)
    for (int64_t eb = 0; eb < E * row_blocks; ++eb) {
      const int64_t e = eb / row_blocks, n0 = (eb % row_blocks) * kBlockSize;
      const int64_t n1 = std::min(N, n0 + kBlockSize);
      float* block_scales = scales + eb * col_blocks;
      // Pass 1: amax of every block in this row block; pass 2 quantizes with it. Converting
      // bf16 rows twice is cheaper than holding 128 converted rows.
      std::fill(block_amax.begin(), block_amax.end(), 0.0f);
      for (int64_t n = n0; n < n1; ++n) {
        const float* row = load_row(w, e * N + n, K, buffer.data());
        for (int64_t b = 0; b < col_blocks; ++b) {
          const int64_t k0 = b * kBlockSize;
          block_amax[b] = cpu::amax_combine(block_amax[b],
                                            cpu::amax_of(row + k0, std::min(kBlockSize, K - k0)));
        }
      }
      for (int64_t b = 0; b < col_blocks; ++b)
        block_scales[b] = cpu::fp8_scale_for_amax(block_amax[b]);
      for (int64_t n = n0; n < n1; ++n) {
        const float* row = load_row(w, e * N + n, K, buffer.data());
        uint8_t* q_row = q + (e * N + n) * K;
        for (int64_t b = 0; b < col_blocks; ++b) {
          const int64_t k0 = b * kBlockSize;
          cpu::quantize_span(row + k0, std::min(kBlockSize, K - k0), block_scales[b], q_row + k0);
        }
      }
    }
  }
}

}  // namespace

namespace cpu {

void quantize_weights(const Context& ctx, const Tensor& w, QuantScheme scheme, const Tensor& q,
                      const Tensor& scale) {
  constexpr const char* fn = "quantize_weights";
  check_context(fn, ctx);
  check_quant_scheme(fn, scheme);
  check_float_operand(fn, "w", w, 3, "(E, N, K)", ctx.device);
  const int64_t E = w.size(0), N = w.size(1), K = w.size(2);
  const std::string context = weight_context(scheme, E, N, K);
  check_exact_operand(fn, "q", q, DType::fp8_e4m3, {E, N, K}, context, ctx.device);
  check_exact_operand(fn, "scale", scale, scale_dtype(scheme), weight_scale_shape(scheme, E, N, K),
                      context, ctx.device);
  check_no_overlap(fn, "q", q, "w", w);
  check_no_overlap(fn, "q", q, "scale", scale);
  check_no_overlap(fn, "scale", scale, "w", w);

  uint8_t* q_data = q.data_ptr<uint8_t>();
  switch (scheme) {
    case QuantScheme::fp8_tensor: {  // one scale per expert
      float* expert_scales = scale.data_ptr<float>();
      per_tensor_scales(w, E, N, K, expert_scales);
      quantize_rows(w, E * N, K, scheme, expert_scales, N, q_data, nullptr, 0);
      return;
    }
    case QuantScheme::fp8_token:  // per output channel: exactly a per-row scale
      quantize_rows(w, E * N, K, scheme, nullptr, 1, q_data, scale.data_ptr<uint8_t>(),
                    sizeof(float));
      return;
    case QuantScheme::mxfp8:
      quantize_rows(w, E * N, K, scheme, nullptr, 1, q_data, scale.data_ptr<uint8_t>(),
                    ceil_div(K, kMxBlockSize));
      return;
    case QuantScheme::fp8_block:
      quantize_weight_blocks(w, E, N, K, q_data, scale.data_ptr<float>());
      return;
    case QuantScheme::none:
      break;
  }
}

void dequantize_weights(const Context& ctx, const Tensor& q, const Tensor& scale,
                        QuantScheme scheme, const Tensor& out) {
  constexpr const char* fn = "dequantize_weights";
  check_context(fn, ctx);
  check_quant_scheme(fn, scheme);
  check_float_operand(fn, "out", out, 3, "(E, N, K)", ctx.device);
  const int64_t E = out.size(0), N = out.size(1), K = out.size(2);
  const std::string context = weight_context(scheme, E, N, K);
  check_exact_operand(fn, "q", q, DType::fp8_e4m3, {E, N, K}, context, ctx.device);
  check_exact_operand(fn, "scale", scale, scale_dtype(scheme), weight_scale_shape(scheme, E, N, K),
                      context, ctx.device);
  check_no_overlap(fn, "out", out, "q", q);
  check_no_overlap(fn, "out", out, "scale", scale);

  const uint8_t* q_data = q.data_ptr<const uint8_t>();
  const int64_t col_blocks = ceil_div(K, kBlockSize), row_blocks = ceil_div(N, kBlockSize);
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < E * N; ++r) {
      const int64_t e = r / N, n = r % N;
      float* target = row_target(out, r, K, buffer.data());
      const uint8_t* q_row = q_data + r * K;
      switch (scheme) {
        case QuantScheme::fp8_tensor:
          cpu::dequantize_row(q_row, K, scheme, scale.data_ptr<const float>() + e, target);
          break;
        case QuantScheme::fp8_token:
          cpu::dequantize_row(q_row, K, scheme, scale.data_ptr<const float>() + r, target);
          break;
        case QuantScheme::fp8_block:  // the row's blocks: scale[e, n / 128, :]
          cpu::dequantize_row(
              q_row, K, scheme,
              scale.data_ptr<const float>() + (e * row_blocks + n / kBlockSize) * col_blocks,
              target);
          break;
        default:  // mxfp8
          cpu::dequantize_row(q_row, K, scheme,
                              scale.data_ptr<const uint8_t>() + r * ceil_div(K, kMxBlockSize),
                              target);
          break;
      }
      store_row(out, r, K, target);
    }
  }
}

}  // namespace cpu
}  // namespace modmoe
