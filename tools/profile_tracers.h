// Tracers for modmoe-profile: they record the ranges one forward opens (modmoe/trace.h) and
// turn them into per-stage timings, measured on the clock that matters for the backend.
//   CpuProfileTracer:  steady_clock timestamps at begin/end (the CPU forward is synchronous).
//   CUDA tracer:       a cudaEvent recorded on ctx.stream at begin/end (GPU time of the work
//                      enqueued in between) plus an NVTX push/pop so Nsight Systems shows the
//                      same ranges. Nothing synchronizes inside the forward: timings() reads
//                      the events after the caller has synchronized the stream.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "modmoe/trace.h"

namespace modmoe::profile {

// One closed range. Times in microseconds from the begin of the first range recorded.
struct StageTiming {
  std::string name;
  int depth = 0;  // 0 for an outermost range; a range lies within the previous one of depth - 1
  double start_us = 0;
  double duration_us = 0;
};

// Records begin/end pairs in order; subclasses supply the clock. Ranges must nest: an end()
// whose name is not the innermost open range's marks the recording as broken (reported by
// timings(); end() itself must not throw).
class ProfileTracer : public Tracer {
 public:
  void begin(const Context& ctx, const char* name) override;
  void end(const Context& ctx, const char* name) noexcept override;

  // Forgets everything recorded (the warm-up forwards run without a tracer anyway).
  void clear();
  // The closed ranges in begin order. Throws Error when ranges are still open or did not nest.
  // CUDA: call after the stream has been synchronized.
  std::vector<StageTiming> timings();

 protected:
  // A timestamp handle for "now" on ctx's clock; read back with elapsed_us(from, to).
  virtual int mark(const Context& ctx) = 0;
  virtual double elapsed_us(int from, int to) = 0;
  virtual void clear_marks() = 0;
  virtual void on_begin(const char* /*name*/) {}
  virtual void on_end() noexcept {}

 private:
  struct Range {
    const char* name;
    int depth;
    int begin_mark;
    int end_mark = -1;
  };
  std::vector<Range> ranges_;
  std::vector<size_t> open_;  // indices into ranges_
  std::string broken_;        // the first nesting error, empty when none
};

class CpuProfileTracer : public ProfileTracer {
 protected:
  int mark(const Context& ctx) override;
  double elapsed_us(int from, int to) override;
  void clear_marks() override { stamps_us_.clear(); }

 private:
  std::vector<double> stamps_us_;  // steady_clock, microseconds
};

// The CUDA tracer (events + NVTX); throws Error in a build without the CUDA backend.
std::unique_ptr<ProfileTracer> make_cuda_profile_tracer();

}  // namespace modmoe::profile
