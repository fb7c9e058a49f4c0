// The CUDA tracer: one cudaEvent per range boundary, recorded on ctx.stream, and an NVTX range
// (NVTX3, header-only, from the CUDA toolkit) so Nsight Systems shows the stages on its
// timeline. Events are created lazily and reused; none is waited on until timings().
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <vector>

#include "modmoe/error.h"
#include "profile_tracers.h"

namespace modmoe::profile {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  MODMOE_CHECK(e == cudaSuccess) << "CudaProfileTracer: " << what
                                 << " failed: " << cudaGetErrorString(e);
}

class CudaProfileTracer : public ProfileTracer {
 public:
  ~CudaProfileTracer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

 protected:
  int mark(const Context& ctx) override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), "cudaEventCreate");  // with timing: not DisableTiming
      events_.push_back(e);
    }
    check_cuda(cudaEventRecord(events_[used_], static_cast<cudaStream_t>(ctx.stream)),
               "cudaEventRecord");
    return static_cast<int>(used_++);
  }

  double elapsed_us(int from, int to) override {
    check_cuda(cudaEventSynchronize(events_[to]), "cudaEventSynchronize");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[from], events_[to]), "cudaEventElapsedTime");
    return 1000.0 * ms;
  }

  void on_begin(const char* name) override { nvtxRangePushA(name); }
  void on_end() noexcept override { nvtxRangePop(); }
  void clear_marks() override { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;  // events_[0, used_) hold this recording's marks
};

}  // namespace

std::unique_ptr<ProfileTracer> make_cuda_profile_tracer() {
  return std::make_unique<CudaProfileTracer>();
}

}  // namespace modmoe::profile
