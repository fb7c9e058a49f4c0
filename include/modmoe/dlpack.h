// Conversion between modmoe::Tensor and DLPack (DLTensor / DLManagedTensor).
#pragma once

#include <dlpack/dlpack.h>

#include "modmoe/tensor.h"

namespace modmoe {

// A view of a DLTensor. Throws Error for dtypes or devices modmoe does not know, and for
// ndim > 4. The DLTensor's owner must outlive the view.
Tensor from_dlpack(const DLTensor& dl);

// A DLManagedTensor viewing `t` (no copy). Its deleter frees only the DLPack structures:
// the memory still belongs to whoever owns `t`.
DLManagedTensor* to_dlpack(const Tensor& t);

}  // namespace modmoe
