#include "core/prepare_finalize_kinds.h"

#include <memory>

#include "modmoe/error.h"

namespace modmoe {

PrepareReceiver NoEPPrepareAndFinalizeBase::prepare_no_receive(const Context& ctx,
                                                               const PrepareArgs& args) {
  // Nothing to wait for without a dispatch: the work is done (or enqueued) now and the
  // receiver hands it over.
  auto result = std::make_shared<PrepareResult>(prepare(ctx, args));
  return [result]() { return std::move(*result); };
}

BatchedPrepareAndFinalizeBase::BatchedPrepareAndFinalizeBase(const MoEConfig& config,
                                                             int num_dispatchers)
    : PrepareAndFinalize(config), num_dispatchers_(num_dispatchers) {
  MODMOE_CHECK(config.max_num_tokens > 0)
      << "BatchedPrepareAndFinalize: config.max_num_tokens must be > 0, got "
      << config.max_num_tokens;
  MODMOE_CHECK(num_dispatchers >= 1)
      << "BatchedPrepareAndFinalize: num_dispatchers must be >= 1, got " << num_dispatchers;
}

}  // namespace modmoe
