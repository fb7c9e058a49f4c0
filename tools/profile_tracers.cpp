#include "profile_tracers.h"

#include <chrono>

#include "modmoe/error.h"

namespace modmoe::profile {

void ProfileTracer::begin(const Context& ctx, const char* name) {
  ranges_.push_back(Range{name, static_cast<int>(open_.size()), mark(ctx)});
  open_.push_back(ranges_.size() - 1);
  on_begin(name);
}

void ProfileTracer::end(const Context& ctx, const char* name) noexcept {
  if (open_.empty() || std::string(ranges_[open_.back()].name) != name) {
    if (broken_.empty()) {
      broken_ = std::string("range '") + name + "' ended while " +
                (open_.empty() ? std::string("no range was open")
                               : "'" + std::string(ranges_[open_.back()].name) + "' was open");
    }
    return;
  }
  try {
    ranges_[open_.back()].end_mark = mark(ctx);
  } catch (const std::exception& e) {  // end() runs in destructors, maybe during unwinding
    if (broken_.empty()) broken_ = std::string("recording the end of '") + name + "': " + e.what();
  }
  open_.pop_back();
  on_end();
}

void ProfileTracer::clear() {
  ranges_.clear();
  open_.clear();
  broken_.clear();
  clear_marks();
}

std::vector<StageTiming> ProfileTracer::timings() {
  MODMOE_CHECK(broken_.empty()) << "ProfileTracer::timings: the ranges did not nest: " << broken_;
  MODMOE_CHECK(open_.empty()) << "ProfileTracer::timings: " << open_.size()
                              << " range(s) still open, the innermost '"
                              << (open_.empty() ? "" : ranges_[open_.back()].name) << "'";
  std::vector<StageTiming> out;
  if (ranges_.empty()) return out;
  const int origin = ranges_.front().begin_mark;
  for (const Range& r : ranges_) {
    out.push_back(StageTiming{r.name, r.depth, elapsed_us(origin, r.begin_mark),
                              elapsed_us(r.begin_mark, r.end_mark)});
  }
  return out;
}

int CpuProfileTracer::mark(const Context&) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  stamps_us_.push_back(std::chrono::duration<double, std::micro>(now).count());
  return static_cast<int>(stamps_us_.size()) - 1;
}

double CpuProfileTracer::elapsed_us(int from, int to) { return stamps_us_[to] - stamps_us_[from]; }

#if !MODMOE_WITH_CUDA
std::unique_ptr<ProfileTracer> make_cuda_profile_tracer() {
  MODMOE_FAIL() << "make_cuda_profile_tracer: this build has no CUDA backend";
  return nullptr;
}
#endif

}  // namespace modmoe::profile
