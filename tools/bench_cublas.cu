// cuBLAS GEMM peaks and the per-expert cuBLAS baseline of the GPU benchmark (bench_cublas.h).
#include <algorithm>
#include <sstream>

#include "bench_cublas.h"
#include "bench_device.h"
#include "bench_kernels.h"
#include "modmoe/error.h"
#include "modmoe/quant.h"

#define BENCH_CUBLAS(expr)                                                                  \
  do {                                                                                      \
    const cublasStatus_t bench_status_ = (expr);                                            \
    MODMOE_CHECK(bench_status_ == CUBLAS_STATUS_SUCCESS)                                    \
        << "modmoe-bench: " << #expr << " failed: " << cublasGetStatusString(bench_status_) \
        << " at " << __FILE__ << ":" << __LINE__;                                           \
  } while (0)

namespace modmoe::bench {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace

// ---- handles ----------------------------------------------------------------------------------

Cublas::Cublas(cudaStream_t stream) : stream_(stream) {
  BENCH_CUBLAS(cublasCreate(&handle_));
  BENCH_CUBLAS(cublasSetStream(handle_, stream));
  BENCH_CUDA(cudaMalloc(&workspace_, kWorkspaceBytes));
  BENCH_CUBLAS(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
  BENCH_CUBLAS(cublasLtCreate(&lt_));
}

Cublas::~Cublas() {
  if (lt_) cublasLtDestroy(lt_);
  if (handle_) cublasDestroy(handle_);
  if (workspace_) cudaFree(workspace_);
}

// ---- block-scaled fp8 through cuBLASLt --------------------------------------------------------

struct BlockFp8Gemm::Plan {
  int64_t m, n, k;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  std::string why;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

BlockFp8Gemm::BlockFp8Gemm(const Cublas& cublas) : cublas_(cublas) {
  BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  BENCH_CUBLAS(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  BENCH_CUBLAS(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                              sizeof(a_mode)));
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                              sizeof(b_mode)));
  // Placeholder scale pointers for the heuristic queries; run() sets the real ones.
  const void* placeholder = cublas_.workspace();
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &placeholder, sizeof(placeholder)));
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                              &placeholder, sizeof(placeholder)));
}

BlockFp8Gemm::~BlockFp8Gemm() {
  plans_.clear();
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

const BlockFp8Gemm::Plan* BlockFp8Gemm::plan_for(int64_t m, int64_t n, int64_t k,
                                                 std::string* why) {
  for (const auto& p : plans_) {
    if (p->m == m && p->n == n && p->k == k) {
      if (why) *why = p->why;
      return p->ok ? p.get() : nullptr;
    }
  }
  auto plan = std::make_unique<Plan>();
  plan->m = m;
  plan->n = n;
  plan->k = k;
  std::ostringstream reason;
  if (cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, m, k) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, n, k) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_16BF, m, n, m) != CUBLAS_STATUS_SUCCESS) {
    reason << "cuBLASLt refused the matrix layouts";
  } else {
    cublasLtMatmulPreference_t pref = nullptr;
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = cublas_.workspace_bytes();
    BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        cublas_.lt(), desc_, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      reason << "cuBLASLt has no 128x128-block fp8 algorithm for m=" << m << " n=" << n
             << " k=" << k << " (" << cublasGetStatusString(status) << ")";
    } else {
      plan->algo = result.algo;
      plan->ok = true;
    }
  }
  plan->why = reason.str();
  if (why) *why = plan->why;
  plans_.push_back(std::move(plan));
  return plans_.back()->ok ? plans_.back().get() : nullptr;
}

std::string BlockFp8Gemm::supports(int64_t m, int64_t n, int64_t k) {
  std::string why;
  plan_for(m, n, k, &why);
  return why;
}

void BlockFp8Gemm::run(int64_t m, int64_t n, int64_t k, const uint8_t* A, const float* a_scale,
                       const uint8_t* B, const float* b_scale, void* D) {
  std::string why;
  const Plan* plan = plan_for(m, n, k, &why);
  MODMOE_CHECK(plan != nullptr) << "BlockFp8Gemm: " << why;
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                              sizeof(a_scale)));
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                              sizeof(b_scale)));
  const float alpha = 1.0f, beta = 0.0f;
  BENCH_CUBLAS(cublasLtMatmul(cublas_.lt(), desc_, &alpha, A, plan->a, B, plan->b, &beta, D,
                              plan->d, D, plan->d, &plan->algo, cublas_.workspace(),
                              cublas_.workspace_bytes(), cublas_.stream()));
}

// ---- peaks ------------------------------------------------------------------------------------

namespace {

// Per-tensor fp8 through cuBLASLt (the plain e4m3 tensor-core rate); 0 when unavailable.
double fp8_tensor_tflops(const Cublas& cublas, int64_t n, const uint8_t* A, const uint8_t* B,
                         void* D, const float* one, int repeats, std::string* why) {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  double tflops = 0;
  BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &one, sizeof(one));
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one, sizeof(one));
  cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, n, n, n);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, n, n, n);
  cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, n, n, n);
  cublasLtMatmulPreferenceCreate(&pref);
  const size_t ws = cublas.workspace_bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(cublas.lt(), desc, a, b, d, d, pref, 1, &result, &found);
  if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    const Timing t = time_replays(cublas.stream(), repeats, 3, nullptr, [&] {
      BENCH_CUBLAS(cublasLtMatmul(cublas.lt(), desc, &alpha, A, a, B, b, &beta, D, d, D, d,
                                  &result.algo, cublas.workspace(), ws, cublas.stream()));
    });
    tflops = 2.0 * double(n) * n * n / (t.median_us * 1e-6) * 1e-12;
  } else {
    *why += std::string("per-tensor fp8: no cuBLASLt algorithm (") + cublasGetStatusString(status) +
            "); ";
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(d);
  cublasLtMatmulDescDestroy(desc);
  return tflops;
}

void measure_block_fp8(const Cublas& cublas, int64_t n, const uint8_t* A8, const uint8_t* B8,
                       void* D, int repeats, GemmPeaks* peaks);

}  // namespace

GemmPeaks measure_gemm_peaks(const Cublas& cublas, int64_t n, int repeats) {
  GemmPeaks peaks;
  peaks.size = n;
  const cudaStream_t stream = cublas.stream();
  const double flops = 2.0 * double(n) * n * n;
  DeviceBuffer D(size_t(n) * n * 2);
  {
    DeviceBuffer A(size_t(n) * n * 2), B(size_t(n) * n * 2);
    fill_normal(A.get(), DType::bf16, n * n, 11, 1.0f, stream);
    fill_normal(B.get(), DType::bf16, n * n, 12, 1.0f, stream);
    const float alpha = 1.0f, beta = 0.0f;
    const Timing t = time_replays(stream, repeats, 3, nullptr, [&] {
      BENCH_CUBLAS(cublasGemmEx(cublas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(n), int(n),
                                &alpha, A.get(), CUDA_R_16BF, int(n), B.get(), CUDA_R_16BF, int(n),
                                &beta, D.get(), CUDA_R_16BF, int(n), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
    });
    peaks.bf16_tflops = flops / (t.median_us * 1e-6) * 1e-12;
  }
  DeviceBuffer A8(size_t(n) * n), B8(size_t(n) * n), one(sizeof(float));
  fill_e4m3(A8.as<uint8_t>(), n * n, 13, stream);
  fill_e4m3(B8.as<uint8_t>(), n * n, 14, stream);
  fill_uniform(one.as<float>(), 1, 15, 1.0f / 4096, 1.0f / 4096, stream);
  // The fp8 measurements are optional: a cuBLAS without them leaves a note, not an abort.
  try {
    peaks.fp8_tensor_tflops = fp8_tensor_tflops(cublas, n, A8.as<uint8_t>(), B8.as<uint8_t>(),
                                                D.get(), one.as<float>(), repeats, &peaks.notes);
  } catch (const std::exception& e) {
    peaks.notes += std::string("per-tensor fp8: ") + e.what() + "; ";
  }
  try {
    measure_block_fp8(cublas, n, A8.as<uint8_t>(), B8.as<uint8_t>(), D.get(), repeats, &peaks);
  } catch (const std::exception& e) {
    peaks.notes += std::string("block fp8: ") + e.what() + "; ";
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  return peaks;
}

namespace {

void measure_block_fp8(const Cublas& cublas, int64_t n, const uint8_t* A8, const uint8_t* B8,
                       void* D, int repeats, GemmPeaks* peaks) {
  const cudaStream_t stream = cublas.stream();
  const double flops = 2.0 * double(n) * n * n;
  BlockFp8Gemm block(cublas);
  const std::string why = block.supports(n, n, n);
  if (why.empty()) {
    const int64_t kb = ceil_div(n, 128);
    DeviceBuffer a_scale(size_t(ceil_div(n, 128)) * round_up(kb, 4) * sizeof(float));
    DeviceBuffer b_scale(size_t(kb) * round_up(n, 4) * sizeof(float));
    fill_uniform(a_scale.as<float>(), a_scale.bytes() / 4, 16, 0.5f / 112, 1.5f / 112, stream);
    fill_uniform(b_scale.as<float>(), b_scale.bytes() / 4, 17, 0.5f / 112, 1.5f / 112, stream);
    const Timing t = time_replays(stream, repeats, 3, nullptr, [&] {
      block.run(n, n, n, A8, a_scale.as<float>(), B8, b_scale.as<float>(), D);
    });
    peaks->fp8_block_tflops = flops / (t.median_us * 1e-6) * 1e-12;
  } else {
    peaks->notes += "block fp8: " + why + "; ";
  }
}

}  // namespace

// ---- the per-expert baseline ------------------------------------------------------------------

struct CublasBaseline::Impl {
  const Cublas& cublas;
  MoEConfig config;
  int64_t M = 0;
  bool fp8 = false;
  const void* x = nullptr;
  const float* topk_weights = nullptr;
  ExpertWeights weights;

  // Host layout of the rows (see bench_kernels.h BaselineRows).
  std::vector<int32_t> count, offset, padded;  // per expert
  int64_t rows = 0;
  DeviceBuffer row_token, row_expert, expert_offset, expert_rows, pair_row;
  BaselineRows layout;

  DeviceBuffer a1, a1_scale, d1, h, h_scale, d2, out;
  DeviceBuffer w13_scale, w2_scale;  // fp8: modmoe's block scales, K blocks padded to 4
  std::unique_ptr<BlockFp8Gemm> block;
  int64_t gemm_calls = 0;

  Impl(const Cublas& c, const BaselineInputs& in)
      : cublas(c),
        config(in.config),
        M(in.M),
        x(in.x),
        topk_weights(in.topk_weights),
        weights(in.weights) {}
};

namespace {

// modmoe's (E, R/128, C/128) weight block scales with the C-block dimension padded to a multiple
// of 4, as cuBLASLt's 128x128 scale tensor rows must be 16-byte aligned.
DeviceBuffer pad_weight_scales(const Tensor& scale, cudaStream_t stream) {
  const int64_t E = scale.size(0), rb = scale.size(1), cb = scale.size(2);
  const int64_t cb_pad = round_up(cb, 4);
  std::vector<float> host(scale.numel()), padded(size_t(E * rb * cb_pad), 1.0f);
  BENCH_CUDA(
      cudaMemcpyAsync(host.data(), scale.data(), scale.nbytes(), cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  for (int64_t i = 0; i < E * rb; ++i)
    std::copy(host.begin() + i * cb, host.begin() + (i + 1) * cb, padded.begin() + i * cb_pad);
  return upload(padded);
}

}  // namespace

CublasBaseline::CublasBaseline(const Cublas& cublas, const BaselineInputs& in)
    : impl_(std::make_unique<Impl>(cublas, in)) {
  Impl& b = *impl_;
  const MoEConfig& c = b.config;
  const int64_t E = c.num_local_experts, K = c.hidden_size, N = c.intermediate_size;
  const int64_t topk = c.topk, M = in.M;
  MODMOE_CHECK(c.in_dtype == DType::bf16) << "cuBLAS baseline: bf16 activations only";
  MODMOE_CHECK(is_gated(c.activation) && c.gated_layout == GatedLayout::GateUp)
      << "cuBLAS baseline: gated activations with [gate; up] weights only";
  MODMOE_CHECK(c.num_local_experts == c.num_experts) << "cuBLAS baseline: no expert_map";
  MODMOE_CHECK(c.quant.scheme == QuantScheme::none || c.quant.scheme == QuantScheme::fp8_block)
      << "cuBLAS baseline: bf16 or fp8-block only, got " << c.quant.str();
  b.fp8 = c.quant.scheme == QuantScheme::fp8_block;

  // Rows expert after expert, each expert padded to 4 rows, pairs in token order.
  b.count.assign(E, 0);
  for (int32_t id : in.topk_ids) {
    MODMOE_CHECK(id >= 0 && id < E) << "cuBLAS baseline: expert id " << id << " out of range";
    ++b.count[id];
  }
  b.offset.assign(E, 0);
  b.padded.assign(E, 0);
  for (int64_t e = 0; e < E; ++e) {
    b.padded[e] = static_cast<int32_t>(round_up(b.count[e], 4));
    b.offset[e] = static_cast<int32_t>(b.rows);
    b.rows += b.padded[e];
  }
  std::vector<int32_t> row_token(b.rows, -1), row_expert(b.rows, 0), pair_row(M * topk, -1);
  std::vector<int32_t> next(b.offset);
  for (int64_t e = 0; e < E; ++e)
    std::fill(row_expert.begin() + b.offset[e], row_expert.begin() + b.offset[e] + b.padded[e],
              int32_t(e));
  for (int64_t p = 0; p < M * topk; ++p) {
    const int32_t r = next[in.topk_ids[p]]++;
    row_token[r] = static_cast<int32_t>(p / topk);
    pair_row[p] = r;
  }
  b.row_token = upload(row_token);
  b.row_expert = upload(row_expert);
  b.expert_offset = upload(b.offset);
  b.expert_rows = upload(b.padded);
  b.pair_row = upload(pair_row);
  b.layout = {b.row_token.as<int32_t>(), b.row_expert.as<int32_t>(), b.expert_offset.as<int32_t>(),
              b.expert_rows.as<int32_t>(), b.rows};

  const int64_t R = std::max<int64_t>(b.rows, 4);
  const size_t act_bytes = b.fp8 ? 1 : 2;
  b.a1 = DeviceBuffer(size_t(R) * K * act_bytes);
  b.d1 = DeviceBuffer(size_t(R) * 2 * N * 2);
  b.h = DeviceBuffer(size_t(R) * N * act_bytes);
  b.d2 = DeviceBuffer(size_t(R) * K * 2);
  b.out = DeviceBuffer(size_t(M) * K * 2);
  const cudaStream_t stream = cublas.stream();
  // Padding rows of the GEMM outputs are never written by a bf16 GEMM (it runs the true row
  // count); zero them once so the activation reads numbers.
  BENCH_CUDA(cudaMemsetAsync(b.d1.get(), 0, b.d1.bytes(), stream));
  if (b.fp8) {
    b.a1_scale = DeviceBuffer(size_t(R) * ceil_div(K, 128) * sizeof(float));
    b.h_scale = DeviceBuffer(size_t(R) * ceil_div(N, 128) * sizeof(float));
    b.w13_scale = pad_weight_scales(in.weights.w13_scale, stream);
    b.w2_scale = pad_weight_scales(in.weights.w2_scale, stream);
    b.block = std::make_unique<BlockFp8Gemm>(cublas);
    for (int64_t e = 0; e < E; ++e) {
      if (b.count[e] == 0) continue;
      for (const auto& [m, k] : {std::pair{2 * N, K}, std::pair{K, N}}) {
        const std::string why = b.block->supports(m, b.padded[e], k);
        MODMOE_CHECK(why.empty()) << why;
      }
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  out_ = b.out.get();
}

CublasBaseline::~CublasBaseline() = default;

std::string CublasBaseline::kind() const {
  const Impl& b = *impl_;
  int64_t hit = 0;
  for (int32_t n : b.count) hit += n > 0;
  std::ostringstream s;
  s << (b.fp8 ? "cublasLt fp8 128x128-block per expert" : "cublasGemmEx bf16 per expert") << " ("
    << hit << " experts x 2 GEMMs)";
  return s.str();
}

void CublasBaseline::enqueue() {
  Impl& b = *impl_;
  const MoEConfig& c = b.config;
  const int64_t E = c.num_local_experts, K = c.hidden_size, N = c.intermediate_size;
  const cudaStream_t stream = b.cublas.stream();
  const float alpha = 1.0f, beta = 0.0f;
  int64_t calls = 0;
  if (!b.fp8) {
    const auto* w13 = static_cast<const uint16_t*>(b.weights.w13.data());
    const auto* w2 = static_cast<const uint16_t*>(b.weights.w2.data());
    gather_rows(b.x, K, b.layout, b.a1.get(), stream);
    for (int64_t e = 0; e < E; ++e) {
      if (b.count[e] == 0) continue;
      BENCH_CUBLAS(cublasGemmEx(b.cublas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(2 * N), b.count[e],
                                int(K), &alpha, w13 + e * 2 * N * K, CUDA_R_16BF, int(K),
                                b.a1.as<uint16_t>() + int64_t(b.offset[e]) * K, CUDA_R_16BF, int(K),
                                &beta, b.d1.as<uint16_t>() + int64_t(b.offset[e]) * 2 * N,
                                CUDA_R_16BF, int(2 * N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      ++calls;
    }
    activation_rows(c.activation, b.d1.get(), N, b.rows, b.h.get(), stream);
    for (int64_t e = 0; e < E; ++e) {
      if (b.count[e] == 0) continue;
      BENCH_CUBLAS(cublasGemmEx(b.cublas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(K), b.count[e],
                                int(N), &alpha, w2 + e * K * N, CUDA_R_16BF, int(N),
                                b.h.as<uint16_t>() + int64_t(b.offset[e]) * N, CUDA_R_16BF, int(N),
                                &beta, b.d2.as<uint16_t>() + int64_t(b.offset[e]) * K, CUDA_R_16BF,
                                int(K), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      ++calls;
    }
  } else {
    const auto* w13 = static_cast<const uint8_t*>(b.weights.w13.data());
    const auto* w2 = static_cast<const uint8_t*>(b.weights.w2.data());
    const int64_t kb_k = ceil_div(K, 128), kb_n = ceil_div(N, 128);
    const int64_t w13_scales = ceil_div(2 * N, 128) * round_up(kb_k, 4);
    const int64_t w2_scales = ceil_div(K, 128) * round_up(kb_n, 4);
    gather_quantize_rows(b.x, K, b.layout, b.a1.as<uint8_t>(), b.a1_scale.as<float>(), stream);
    for (int64_t e = 0; e < E; ++e) {
      if (b.count[e] == 0) continue;
      const int64_t off = b.offset[e];
      b.block->run(2 * N, b.padded[e], K, w13 + e * 2 * N * K,
                   b.w13_scale.as<float>() + e * w13_scales, b.a1.as<uint8_t>() + off * K,
                   b.a1_scale.as<float>() + off * kb_k, b.d1.as<uint16_t>() + off * 2 * N);
      ++calls;
    }
    activation_quantize_rows(c.activation, b.d1.get(), N, b.layout, b.h.as<uint8_t>(),
                             b.h_scale.as<float>(), stream);
    for (int64_t e = 0; e < E; ++e) {
      if (b.count[e] == 0) continue;
      const int64_t off = b.offset[e];
      b.block->run(K, b.padded[e], N, w2 + e * K * N, b.w2_scale.as<float>() + e * w2_scales,
                   b.h.as<uint8_t>() + off * N, b.h_scale.as<float>() + off * kb_n,
                   b.d2.as<uint16_t>() + off * K);
      ++calls;
    }
  }
  weighted_sum_rows(b.d2.get(), K, b.pair_row.as<int32_t>(), b.topk_weights, b.M, c.topk,
                    b.out.get(), stream);
  gemm_calls_ = calls;
}

}  // namespace modmoe::bench
