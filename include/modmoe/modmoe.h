// Everything a user of modmoe includes.
#pragma once

#include "modmoe/activation.h"
#include "modmoe/allocator.h"
#include "modmoe/context.h"
#include "modmoe/dtype.h"
#include "modmoe/error.h"
#include "modmoe/experts.h"
#include "modmoe/modular_kernel.h"
#include "modmoe/moe_gemm.h"
#include "modmoe/moe_types.h"
#include "modmoe/prepare_finalize.h"
#include "modmoe/quant.h"
#include "modmoe/registry.h"
#include "modmoe/router.h"
#include "modmoe/tensor.h"
#include "modmoe/topk_weight_and_reduce.h"
#include "modmoe/trace.h"
