// The CUDA activation quantizer against the CPU one, byte for byte: codes and scales of every
// scheme, bf16/fp16/fp32 inputs, aligned (vectorized) and unaligned (scalar) paths, static
// scales, non-finite inputs, a dense sweep of rounding cases, the num_rows bound of
// cuda::quantize_rows, and the argument checks of the public entry points on a CUDA context.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/quantize.h"
#include "modmoe/allocator.h"
#include "modmoe/numeric.h"
#include "modmoe/quant.h"

namespace modmoe {
namespace {

using ::modmoe::testing::bytes_of;
using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::HasSubstr;

constexpr uint8_t kPoison = 0xC3;  // a byte no correct result has everywhere
constexpr QuantScheme kSchemes[] = {QuantScheme::fp8_tensor, QuantScheme::fp8_token,
                                    QuantScheme::fp8_block, QuantScheme::mxfp8};
constexpr DType kFloatDTypes[] = {DType::bf16, DType::fp16, DType::fp32};

// ---- data ---------------------------------------------------------------------------------------

// Rows of very different magnitudes (per-token scales differ), 32-column groups at different
// magnitudes within a row (block and MX scales differ), values deep in fp8's subnormal range,
// and one all-zero 128-column group in row 1 (its scale must be exactly 1).
OwnedTensor random_activations(DType dtype, int64_t M, int64_t K, std::mt19937& rng) {
  OwnedTensor x = host_tensor(dtype, {M, K});
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  for (int64_t m = 0; m < M; ++m) {
    const float row_scale = std::ldexp(1.0f, exponent(rng));
    for (int64_t k = 0; k < K; ++k) {
      const int64_t group = k / 32;
      const float group_scale = group % 5 == 0 ? 0.01f : (group % 7 == 3 ? 30.0f : 1.0f);
      float v = normal(rng) * row_scale * group_scale;
      if (m == 1 && k < 128) v = 0.0f;
      store_float(x.tensor().data(), dtype, m * K + k, v);
    }
  }
  return x;
}

// A host tensor filled with kPoison bytes.
OwnedTensor poisoned_host(DType dtype, const Shape& shape) {
  OwnedTensor t = host_tensor(dtype, shape);
  std::memset(t.tensor().data(), kPoison, t.tensor().nbytes());
  return t;
}

// A device tensor filled with kPoison bytes.
OwnedTensor poisoned_device(const CudaSession& gpu, DType dtype, const Shape& shape) {
  return gpu.to_device(poisoned_host(dtype, shape));
}

// "" when equal, else where the first difference is and how many bytes differ.
std::string byte_diff(const std::vector<uint8_t>& expected, const std::vector<uint8_t>& actual) {
  if (expected.size() != actual.size()) return "sizes differ";
  int64_t first = -1, count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++count;
    }
  }
  if (count == 0) return "";
  std::ostringstream s;
  s << count << " of " << expected.size() << " bytes differ; first at byte " << first
    << ": expected 0x" << std::hex << int{expected[first]} << ", got 0x" << int{actual[first]};
  return s.str();
}

// Element-wise equality of two float tensors of the same dtype, NaN equal to NaN (the GPU
// returns one canonical NaN where x86 propagates an operand's).
std::string float_diff(const Tensor& expected, const Tensor& actual) {
  int64_t count = 0, first = -1;
  const int64_t n = expected.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float e = load_float(expected.data(), expected.dtype(), i);
    const float a = load_float(actual.data(), actual.dtype(), i);
    const bool same = (std::isnan(e) && std::isnan(a)) ||
                      (!std::isnan(e) && !std::isnan(a) && float_bits(e) == float_bits(a));
    if (!same) {
      if (first < 0) first = i;
      ++count;
    }
  }
  if (count == 0) return "";
  std::ostringstream s;
  s << count << " of " << n << " elements differ; first at " << first << ": expected "
    << load_float(expected.data(), expected.dtype(), first) << ", got "
    << load_float(actual.data(), actual.dtype(), first);
  return s.str();
}

struct Quantized {
  OwnedTensor q, scale;
};

Quantized quantize_on_cpu(const Tensor& x, QuantScheme scheme, bool static_scale = false,
                          float static_value = 0.0f) {
  const int64_t M = x.size(0), K = x.size(1);
  Quantized r{poisoned_host(DType::fp8_e4m3, {M, K}),
              poisoned_host(scale_dtype(scheme), act_scale_shape(scheme, M, K))};
  if (static_scale) r.scale.data_ptr<float>()[0] = static_value;
  quantize_activations(Context::cpu(), x, scheme, static_scale, r.q, r.scale);
  return r;
}

// Quantizes the device tensor x_dev (a view) on the GPU; returns host copies of q and scale.
Quantized quantize_on_gpu(const CudaSession& gpu, const Tensor& x_dev, QuantScheme scheme,
                          const Tensor& q_dev, bool static_scale = false,
                          float static_value = 0.0f) {
  const int64_t M = x_dev.size(0), K = x_dev.size(1);
  OwnedTensor scale_host = poisoned_host(scale_dtype(scheme), act_scale_shape(scheme, M, K));
  if (static_scale) scale_host.data_ptr<float>()[0] = static_value;
  OwnedTensor scale_dev = gpu.to_device(scale_host);
  quantize_activations(gpu.ctx(), x_dev, scheme, static_scale, q_dev, scale_dev);
  return Quantized{gpu.to_host(q_dev), gpu.to_host(scale_dev)};
}

std::string describe_case(QuantScheme scheme, DType dtype, int64_t M, int64_t K) {
  std::ostringstream s;
  s << quant_scheme_name(scheme) << " " << dtype_name(dtype) << " (M, K) = (" << M << ", " << K
    << ")";
  return s.str();
}

// ---- quantize and dequantize ------------------------------------------------------------------

// K = 2880 (gpt-oss: 22.5 groups of 128, several steps of 256 threads), 200 (one partial warp,
// partial groups) and 203 (not a multiple of 8: the scalar path, a partial last chunk).
TEST(CudaQuant, MatchesCpuBitForBit) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 19;
  for (int64_t K : {2880, 200, 203}) {
    for (DType dtype : kFloatDTypes) {
      const uint32_t seed = static_cast<uint32_t>(1000 + K + static_cast<int>(dtype));
      std::mt19937 rng(seed);
      const OwnedTensor x = random_activations(dtype, M, K, rng);
      const OwnedTensor x_dev = gpu.to_device(x);
      for (QuantScheme scheme : kSchemes) {
        SCOPED_TRACE(describe_case(scheme, dtype, M, K) + ", seed " + std::to_string(seed));
        const Quantized cpu = quantize_on_cpu(x, scheme);
        const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
        const Quantized gpu_result = quantize_on_gpu(gpu, x_dev, scheme, q_dev);
        EXPECT_EQ(byte_diff(bytes_of(cpu.scale), bytes_of(gpu_result.scale)), "") << "scales";
        EXPECT_EQ(byte_diff(bytes_of(cpu.q), bytes_of(gpu_result.q)), "") << "codes";

        // Dequantize the same codes and scales on both sides, into the input's dtype.
        OwnedTensor out_cpu = poisoned_host(dtype, {M, K});
        dequantize_activations(Context::cpu(), cpu.q, cpu.scale, scheme, out_cpu);
        const OwnedTensor scale_dev = gpu.to_device(cpu.scale);
        const OwnedTensor q_cpu_dev = gpu.to_device(cpu.q);
        const OwnedTensor out_dev = poisoned_device(gpu, dtype, {M, K});
        dequantize_activations(gpu.ctx(), q_cpu_dev, scale_dev, scheme, out_dev);
        EXPECT_EQ(float_diff(out_cpu, gpu.to_host(out_dev)), "") << "dequantized";
      }
    }
  }
}

// x and q one element off their allocation's alignment: the kernels must fall back from
// 16-byte loads and 8-byte stores and still give the same bytes.
TEST(CudaQuant, UnalignedBuffersMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 5, K = 256;
  for (DType dtype : kFloatDTypes) {
    std::mt19937 rng(77);
    const OwnedTensor x = random_activations(dtype, M, K, rng);
    const OwnedTensor x_buffer = gpu.empty(dtype, {M * K + 1});
    const OwnedTensor q_buffer = poisoned_device(gpu, DType::fp8_e4m3, {M * K + 1});
    const Tensor x_dev(static_cast<char*>(x_buffer.tensor().data()) + dtype_size(dtype), dtype,
                       {M, K}, Device::cuda(0));
    const Tensor q_dev(static_cast<char*>(q_buffer.tensor().data()) + 1, DType::fp8_e4m3, {M, K},
                       Device::cuda(0));
    copy_tensor(gpu.ctx(), x_dev, x);
    for (QuantScheme scheme : kSchemes) {
      SCOPED_TRACE(describe_case(scheme, dtype, M, K) + ", unaligned");
      const Quantized cpu = quantize_on_cpu(x, scheme);
      const Quantized gpu_result = quantize_on_gpu(gpu, x_dev, scheme, q_dev);
      EXPECT_EQ(byte_diff(bytes_of(cpu.scale), bytes_of(gpu_result.scale)), "") << "scales";
      EXPECT_EQ(byte_diff(bytes_of(cpu.q), bytes_of(gpu_result.q)), "") << "codes";
    }
    // The byte before q's view was not touched.
    const OwnedTensor q_all = gpu.to_host(q_buffer);
    EXPECT_EQ(q_all.data_ptr<uint8_t>()[0], kPoison);
  }
}

// More rows than the grid has blocks: the grid-stride loop over rows, and a per-tensor amax
// that crosses many blocks.
TEST(CudaQuant, ManyRowsMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 3000, K = 2880;
  std::mt19937 rng(2024);
  const OwnedTensor x = random_activations(DType::bf16, M, K, rng);
  const OwnedTensor x_dev = gpu.to_device(x);
  for (QuantScheme scheme : kSchemes) {
    SCOPED_TRACE(describe_case(scheme, DType::bf16, M, K));
    const Quantized cpu = quantize_on_cpu(x, scheme);
    const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
    const Quantized gpu_result = quantize_on_gpu(gpu, x_dev, scheme, q_dev);
    EXPECT_EQ(byte_diff(bytes_of(cpu.scale), bytes_of(gpu_result.scale)), "") << "scales";
    EXPECT_EQ(byte_diff(bytes_of(cpu.q), bytes_of(gpu_result.q)), "") << "codes";
  }
}

// Rounding cases, densely: e4m3 midpoints (ties to even) and their fp32 neighbours in every
// binade from 2^-12 to 2^9, the subnormal range, values around 448 and far above, inf, NaN
// of both signs, fp32 subnormals and signed zeros, plus random bit patterns. A static scale
// of 1 makes the code exactly e4m3(x); 0.75 adds a rounded division in front of it.
TEST(CudaQuant, StaticScaleRoundingSweepMatchesCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  std::vector<float> values;
  auto add_with_neighbours = [&](float v) {
    for (float s : {v, -v}) {
      values.push_back(s);
      values.push_back(std::nextafter(s, INFINITY));
      values.push_back(std::nextafter(s, -INFINITY));
    }
  };
  for (int e = -12; e <= 9; ++e) {
    for (int m = 0; m < 16; ++m) add_with_neighbours(std::ldexp(1.0f + m / 16.0f, e));
  }
  for (int k = 0; k <= 40; ++k) add_with_neighbours(std::ldexp(static_cast<float>(k), -10));
  for (float v : {440.0f, 448.0f, 449.0f, 463.0f, 464.0f, 465.0f, 480.0f, 500.0f, 1e6f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  1e-40f, 0.0f}) {
    add_with_neighbours(v);
  }
  for (float v : {INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN()}) {
    values.push_back(v);
  }
  std::mt19937 rng(5);
  while (values.size() % 256 != 0 || values.size() < 8192) {
    values.push_back(bits_float(static_cast<uint32_t>(rng())));
  }
  const int64_t K = 256, M = static_cast<int64_t>(values.size()) / K;
  OwnedTensor x = host_tensor(DType::fp32, {M, K});
  std::memcpy(x.tensor().data(), values.data(), values.size() * sizeof(float));
  const OwnedTensor x_dev = gpu.to_device(x);
  for (float static_value : {1.0f, 0.75f}) {
    SCOPED_TRACE("static scale " + std::to_string(static_value));
    const Quantized cpu = quantize_on_cpu(x, QuantScheme::fp8_tensor, true, static_value);
    const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
    const Quantized gpu_result =
        quantize_on_gpu(gpu, x_dev, QuantScheme::fp8_tensor, q_dev, true, static_value);
    const std::vector<uint8_t> expected = bytes_of(cpu.q), actual = bytes_of(gpu_result.q);
    EXPECT_EQ(byte_diff(expected, actual), "");
    for (size_t i = 0, shown = 0; i < expected.size() && shown < 10; ++i) {
      if (expected[i] == actual[i]) continue;
      ADD_FAILURE() << "x = " << values[i] << " (bits 0x" << std::hex << float_bits(values[i])
                    << "): cpu 0x" << int{expected[i]} << ", gpu 0x" << int{actual[i]};
      ++shown;
    }
    // A static scale is read, never written.
    EXPECT_EQ(gpu_result.scale.data_ptr<float>()[0], static_value);
  }
}

// NaN and inf inside rows and groups: the scales of the groups they touch become NaN and
// every code there a NaN code; the CPU's signs and scales must come out exactly.
TEST(CudaQuant, NonFiniteInputsMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 6, K = 384;
  for (DType dtype : kFloatDTypes) {
    std::mt19937 rng(31);
    OwnedTensor x = random_activations(dtype, M, K, rng);
    store_float(x.tensor().data(), dtype, 0 * K + 5, std::numeric_limits<float>::quiet_NaN());
    store_float(x.tensor().data(), dtype, 2 * K + 130, -std::numeric_limits<float>::quiet_NaN());
    store_float(x.tensor().data(), dtype, 3 * K + 300, INFINITY);
    store_float(x.tensor().data(), dtype, 4 * K + 33, -INFINITY);
    const OwnedTensor x_dev = gpu.to_device(x);
    for (QuantScheme scheme : kSchemes) {
      SCOPED_TRACE(describe_case(scheme, dtype, M, K) + " with NaN and inf");
      const Quantized cpu = quantize_on_cpu(x, scheme);
      const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
      const Quantized gpu_result = quantize_on_gpu(gpu, x_dev, scheme, q_dev);
      EXPECT_EQ(byte_diff(bytes_of(cpu.scale), bytes_of(gpu_result.scale)), "") << "scales";
      // The sign of a NaN carries no meaning and is not preserved alike by x86 and the GPU
      // (fp16 -> fp32 conversion on the GPU canonicalizes NaN): compare NaN codes unsigned.
      auto unsigned_nan = [](std::vector<uint8_t> codes) {
        for (uint8_t& c : codes)
          if ((c & 0x7f) == 0x7f) c = 0x7f;
        return codes;
      };
      EXPECT_EQ(byte_diff(unsigned_nan(bytes_of(cpu.q)), unsigned_nan(bytes_of(gpu_result.q))), "")
          << "codes";
    }
  }
}

// Groups so small that their scale (amax / 448) is a subnormal float, whose reciprocal
// overflows: the quantizers multiply by RN(2^-64 / scale) after scaling x by 2^64
// (formats.md). Rows: amax ~3e-39, ~1e-41, a few multiples of the smallest float, and a row
// whose first group is tiny and the rest normal (per-token then has a normal scale).
TEST(CudaQuant, SubnormalScalesMatchCpu) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 4, K = 256;
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : {DType::fp32, DType::bf16}) {  // fp16 has no such small values
    OwnedTensor x = host_tensor(dtype, {M, K});
    for (int64_t k = 0; k < K; ++k) {
      store_float(x.tensor().data(), dtype, 0 * K + k, normal(rng) * 1e-39f);
      store_float(x.tensor().data(), dtype, 1 * K + k, normal(rng) * 4e-42f);
      store_float(x.tensor().data(), dtype, 2 * K + k,
                  static_cast<float>(k % 7) * std::numeric_limits<float>::denorm_min());
      store_float(x.tensor().data(), dtype, 3 * K + k, normal(rng) * (k < 128 ? 1e-40f : 1.0f));
    }
    const OwnedTensor x_dev = gpu.to_device(x);
    for (QuantScheme scheme : {QuantScheme::fp8_token, QuantScheme::fp8_block}) {
      SCOPED_TRACE(describe_case(scheme, dtype, M, K) + " with subnormal scales");
      const Quantized cpu = quantize_on_cpu(x, scheme);
      ASSERT_LT(cpu.scale.data_ptr<float>()[0], std::numeric_limits<float>::min());
      const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
      const Quantized gpu_result = quantize_on_gpu(gpu, x_dev, scheme, q_dev);
      EXPECT_EQ(byte_diff(bytes_of(cpu.scale), bytes_of(gpu_result.scale)), "") << "scales";
      EXPECT_EQ(byte_diff(bytes_of(cpu.q), bytes_of(gpu_result.q)), "") << "codes";
    }
  }
}

// An empty tensor: per-tensor dynamic quantization still writes its scale, 1 (as the CPU);
// the other schemes have nothing to do (their empty tensors have no memory at all).
TEST(CudaQuant, EmptyTensorGetsScaleOne) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const OwnedTensor x_dev = gpu.empty(DType::bf16, {0, 256});
  const OwnedTensor q_dev = gpu.empty(DType::fp8_e4m3, {0, 256});
  const OwnedTensor scale_dev = poisoned_device(gpu, DType::fp32, {1});
  quantize_activations(gpu.ctx(), x_dev, QuantScheme::fp8_tensor, false, q_dev, scale_dev);
  EXPECT_EQ(gpu.to_host(scale_dev).data_ptr<float>()[0], 1.0f);
  for (QuantScheme scheme : {QuantScheme::fp8_token, QuantScheme::fp8_block, QuantScheme::mxfp8}) {
    const OwnedTensor no_scales = gpu.empty(scale_dtype(scheme), act_scale_shape(scheme, 0, 256));
    EXPECT_NO_THROW(quantize_activations(gpu.ctx(), x_dev, scheme, false, q_dev, no_scales))
        << quant_scheme_name(scheme);
    EXPECT_NO_THROW(dequantize_activations(gpu.ctx(), q_dev, no_scales, scheme, x_dev))
        << quant_scheme_name(scheme);
  }
  gpu.sync();
}

// ---- cuda::quantize_rows: row stride and the device row bound --------------------------------

// Only rows < *num_rows are read, written and counted in the per-tensor amax: the rows past
// the bound hold huge values (a wrong amax would show in every code) and their codes and
// scales must keep the poison. x rows sit at a stride larger than K.
TEST(CudaQuant, NumRowsBoundsTheWork) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t capacity = 16, valid = 9, ldx = 232;
  for (int64_t K : {200, 203}) {
    std::mt19937 rng(static_cast<uint32_t>(K));
    OwnedTensor x_rows = random_activations(DType::bf16, capacity, K, rng);
    for (int64_t i = valid * K; i < capacity * K; ++i) {
      store_float(x_rows.tensor().data(), DType::bf16, i, 1.0e4f * (1 + i % 3));
    }
    // x with row stride ldx > K on the device; the valid rows alone, contiguous, for the CPU.
    OwnedTensor x_strided = poisoned_host(DType::bf16, {capacity, ldx});
    for (int64_t r = 0; r < capacity; ++r) {
      std::memcpy(x_strided.data_ptr<uint16_t>() + r * ldx, x_rows.data_ptr<uint16_t>() + r * K,
                  K * sizeof(uint16_t));
    }
    const Tensor x_valid = x_rows.tensor().slice(0, valid);
    const OwnedTensor x_dev = gpu.to_device(x_strided);
    OwnedTensor bound = host_tensor(DType::int32, {1});
    for (int32_t num_rows : {static_cast<int32_t>(valid), 0}) {
      bound.data_ptr<int32_t>()[0] = num_rows;
      const OwnedTensor bound_dev = gpu.to_device(bound);
      for (QuantScheme scheme : kSchemes) {
        SCOPED_TRACE(describe_case(scheme, DType::bf16, capacity, K) + ", num_rows " +
                     std::to_string(num_rows));
        const Shape scale_shape = act_scale_shape(scheme, capacity, K);
        const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {capacity, K});
        const OwnedTensor scale_dev = poisoned_device(gpu, scale_dtype(scheme), scale_shape);
        cuda::quantize_rows(x_dev.tensor().data(), DType::bf16, ldx, capacity,
                            bound_dev.data_ptr<int32_t>(), K, scheme, false,
                            q_dev.data_ptr<uint8_t>(), scale_dev.tensor().data(), gpu.stream());
        const std::vector<uint8_t> q = bytes_of(gpu.to_host(q_dev));
        const std::vector<uint8_t> scale = bytes_of(gpu.to_host(scale_dev));

        const Quantized cpu = quantize_on_cpu(x_valid.slice(0, num_rows), scheme);
        const std::vector<uint8_t> cpu_q = bytes_of(cpu.q), cpu_scale = bytes_of(cpu.scale);
        const std::vector<uint8_t> q_head(q.begin(), q.begin() + cpu_q.size());
        EXPECT_EQ(byte_diff(cpu_q, q_head), "") << "codes of the valid rows";
        for (size_t i = cpu_q.size(); i < q.size(); ++i) {
          ASSERT_EQ(q[i], kPoison) << "code byte " << i << " past num_rows was written";
        }
        if (scheme == QuantScheme::fp8_tensor) {
          // The tensor scale is always written: from the valid rows only (1 when there are none).
          EXPECT_EQ(byte_diff(cpu_scale, scale), "") << "tensor scale";
        } else {
          const std::vector<uint8_t> scale_head(scale.begin(), scale.begin() + cpu_scale.size());
          EXPECT_EQ(byte_diff(cpu_scale, scale_head), "") << "scales of the valid rows";
          for (size_t i = cpu_scale.size(); i < scale.size(); ++i) {
            ASSERT_EQ(scale[i], kPoison) << "scale byte " << i << " past num_rows was written";
          }
        }
      }
    }
  }
}

// ---- cuda::quantize_scatter_rows: the quantization fused into the gather by expert ----------

// Each source row quantized once and written to its destination rows (fanout like topk: 2, 3,
// 8, and 11, past the 8 destinations the kernel holds): every destination row must hold the
// CPU's codes and scales of its source row, byte for byte; rows that no entry names (the -1
// entries, like pairs of no local expert) keep the poison.
// K = 2880 (two 2048-column steps, a partial last group), 2056 (a second step of one lane),
// 203 (the scalar path); 2000 rows of K = 2064 at fanout 8 (topk of the Qwen and DeepSeek
// layers) give each block several rows and steps (the grid is one wave: ~1000 blocks on an H200).
TEST(CudaQuant, ScatterWritesEachSourceRowToItsDestinations) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  struct Case {
    int64_t rows, fanout, K;
  };
  for (const Case& c : std::vector<Case>{{37, 3, 2880},
                                         {37, 3, 203},
                                         {37, 11, 2880},
                                         {37, 11, 203},
                                         {37, 2, 2056},
                                         {2000, 8, 2064}}) {
    const int64_t rows = c.rows, fanout = c.fanout, K = c.K, capacity = rows * fanout;
    std::mt19937 rng(static_cast<uint32_t>(K * fanout) + 11);
    const OwnedTensor x = random_activations(DType::bf16, rows, K, rng);
    // A permutation of the capacity's rows, with every 7th entry -1 (its row stays unwritten).
    std::vector<int32_t> order(capacity);
    for (int64_t i = 0; i < capacity; ++i) order[i] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    OwnedTensor dst = host_tensor(DType::int32, {rows, fanout});
    for (int64_t i = 0; i < capacity; ++i) dst.data_ptr<int32_t>()[i] = i % 7 == 3 ? -1 : order[i];
    const OwnedTensor x_dev = gpu.to_device(x), dst_dev = gpu.to_device(dst);
    for (QuantScheme scheme : kSchemes) {
      SCOPED_TRACE(describe_case(scheme, DType::bf16, rows, K) + " fanout " +
                   std::to_string(fanout));
      const Shape scale_shape = act_scale_shape(scheme, capacity, K);
      const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {capacity, K});
      const OwnedTensor scale_dev = poisoned_device(gpu, scale_dtype(scheme), scale_shape);
      cuda::quantize_scatter_rows(x_dev.tensor().data(), DType::bf16, rows, K, scheme,
                                  dst_dev.data_ptr<int32_t>(), fanout, q_dev.data_ptr<uint8_t>(),
                                  scale_dev.tensor().data(), gpu.stream());
      const std::vector<uint8_t> q = bytes_of(gpu.to_host(q_dev));
      const std::vector<uint8_t> scale = bytes_of(gpu.to_host(scale_dev));
      const Quantized cpu = quantize_on_cpu(x, scheme);
      const std::vector<uint8_t> cpu_q = bytes_of(cpu.q), cpu_scale = bytes_of(cpu.scale);
      const bool row_scales = scheme != QuantScheme::fp8_tensor;
      const size_t scale_row_bytes = row_scales ? cpu_scale.size() / rows : 0;
      std::vector<bool> written(capacity, false);
      for (int64_t i = 0; i < capacity; ++i) {
        const int32_t d = dst.data_ptr<int32_t>()[i];
        if (d < 0) continue;
        written[d] = true;
        const int64_t src = i / fanout;
        const std::vector<uint8_t> want(cpu_q.begin() + src * K, cpu_q.begin() + (src + 1) * K);
        const std::vector<uint8_t> got(q.begin() + d * K, q.begin() + (d + 1) * K);
        ASSERT_EQ(byte_diff(want, got), "") << "codes of source row " << src << " in row " << d;
        if (row_scales) {
          const auto at = [&](const std::vector<uint8_t>& v, int64_t r) {
            return std::vector<uint8_t>(v.begin() + r * scale_row_bytes,
                                        v.begin() + (r + 1) * scale_row_bytes);
          };
          ASSERT_EQ(byte_diff(at(cpu_scale, src), at(scale, d)), "")
              << "scales of source row " << src << " in row " << d;
        }
      }
      if (!row_scales) EXPECT_EQ(byte_diff(cpu_scale, scale), "") << "tensor scale";
      for (int64_t d = 0; d < capacity; ++d) {
        if (written[d]) continue;
        for (int64_t k = 0; k < K; ++k) ASSERT_EQ(q[d * K + k], kPoison) << "row " << d;
        for (size_t b = 0; b < scale_row_bytes; ++b)
          ASSERT_EQ(scale[d * scale_row_bytes + b], kPoison) << "scale row " << d;
      }
    }
  }
}

// ---- argument checks on a CUDA context --------------------------------------------------------

TEST(CudaQuant, RejectsHostTensorsAndBadArguments) {
  MODMOE_REQUIRE_GPU();
  CudaSession gpu;
  const int64_t M = 5, K = 96;
  std::mt19937 rng(9);
  const OwnedTensor x = random_activations(DType::bf16, M, K, rng);
  const OwnedTensor x_dev = gpu.to_device(x);
  const OwnedTensor q_dev = poisoned_device(gpu, DType::fp8_e4m3, {M, K});
  const OwnedTensor scale_dev = poisoned_device(gpu, DType::fp32, {M, 1});
  const OwnedTensor q_host = poisoned_host(DType::fp8_e4m3, {M, K});
  const Context& ctx = gpu.ctx();

  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x, QuantScheme::fp8_token, false, q_dev, scale_dev);
              }),
              HasSubstr("quantize_activations: x must be on cuda:0, got bf16 (5, 96) on cpu"));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x_dev, QuantScheme::fp8_token, false, q_host, scale_dev);
              }),
              HasSubstr("quantize_activations: q must be on cuda:0, got fp8_e4m3 (5, 96) on cpu"));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x_dev, QuantScheme::mxfp8, false, q_dev, scale_dev);
              }),
              HasSubstr("quantize_activations: scale must be e8m0 (5, 3) for mxfp8"));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x_dev, QuantScheme::fp8_token, true, q_dev, scale_dev);
              }),
              HasSubstr("quantize_activations: static_scale is only supported with fp8-tensor"));
  EXPECT_THAT(error_of([&] {
                quantize_activations(ctx, x_dev, QuantScheme::none, false, q_dev, scale_dev);
              }),
              HasSubstr("quantize_activations: scheme must be one of fp8-tensor"));
  const Tensor strided(x_dev.tensor().data(), DType::bf16, {2, K}, {2 * K, 1}, Device::cuda(0));
  EXPECT_THAT(error_of([&] {
                quantize_activations(
                    ctx, strided, QuantScheme::fp8_token, false,
                    Tensor(q_dev.tensor().data(), DType::fp8_e4m3, {2, K}, Device::cuda(0)),
                    Tensor(scale_dev.tensor().data(), DType::fp32, {2, 1}, Device::cuda(0)));
              }),
              HasSubstr("quantize_activations: x must be contiguous (row-major)"));
  EXPECT_THAT(
      error_of([&] { dequantize_activations(ctx, q_dev, scale_dev, QuantScheme::fp8_token, x); }),
      HasSubstr("dequantize_activations: out must be on cuda:0, got bf16 (5, 96) on cpu"));
  const OwnedTensor w_dev = gpu.empty(DType::bf16, {2, 8, 32});
  const OwnedTensor wq_dev = gpu.empty(DType::fp8_e4m3, {2, 8, 32});
  const OwnedTensor ws_dev = gpu.empty(DType::fp32, {2});
  EXPECT_THAT(
      error_of([&] { quantize_weights(ctx, w_dev, QuantScheme::fp8_tensor, wq_dev, ws_dev); }),
      HasSubstr("quantize_weights: not implemented on cuda"));
  EXPECT_THAT(
      error_of([&] { dequantize_weights(ctx, wq_dev, ws_dev, QuantScheme::fp8_tensor, w_dev); }),
      HasSubstr("dequantize_weights: not implemented on cuda"));

  // No failed call launched anything.
  EXPECT_EQ(byte_diff(std::vector<uint8_t>(M * K, kPoison), bytes_of(gpu.to_host(q_dev))), "");
  EXPECT_EQ(byte_diff(std::vector<uint8_t>(M * 4, kPoison), bytes_of(gpu.to_host(scale_dev))), "");
}

}  // namespace
}  // namespace modmoe
