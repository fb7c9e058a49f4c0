// Tracing hook: named ranges around the stages of a forward (prepare, apply, GEMMs, ...).
//
// A caller that wants timings sets Context::tracer; the library opens a TraceRange around each
// stage, and the tracer decides what a range means (wall-clock timestamps on the CPU, CUDA
// events and NVTX ranges on a GPU: see tools/profile_tracers.h). Without a tracer a range costs
// one branch, so the hooks stay in the forward for good.
#pragma once

#include "modmoe/context.h"

namespace modmoe {

// Receives begin/end pairs, properly nested, on the thread that runs the forward (never from
// inside a parallel region). `name` is a string literal: it outlives the tracer. end() is also
// called while an exception unwinds, so it must not throw.
class Tracer {
 public:
  virtual ~Tracer() = default;
  virtual void begin(const Context& ctx, const char* name) = 0;
  virtual void end(const Context& ctx, const char* name) noexcept = 0;
};

// Opens a range on ctx.tracer until close() or the end of the object's lifetime, whichever
// comes first (close() lets a stage end without a new scope for the variables it defines).
// A no-op without a tracer.
class TraceRange {
 public:
  TraceRange(const Context& ctx, const char* name) : ctx_(ctx), name_(name) {
    if (ctx_.tracer != nullptr) ctx_.tracer->begin(ctx_, name_);
  }
  ~TraceRange() { close(); }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

  void close() noexcept {
    if (ctx_.tracer != nullptr && name_ != nullptr) ctx_.tracer->end(ctx_, name_);
    name_ = nullptr;
  }

 private:
  const Context& ctx_;
  const char* name_;  // nullptr once closed
};

}  // namespace modmoe
