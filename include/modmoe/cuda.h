// The CUDA side of the public API: contexts on a device and stream, the default device
// allocator, and host<->device copies. In a build without CUDA every function throws Error.
#pragma once

#include "modmoe/context.h"
#include "modmoe/tensor.h"

namespace modmoe {

// True when this build has the CUDA backend and a CUDA device is visible.
bool cuda_available();
// Number of visible CUDA devices (0 without the backend or a driver).
int cuda_device_count();

// A Context on CUDA device `index`, running on `stream` (a cudaStream_t; nullptr = the
// per-thread default stream is NOT used: pass your stream), with sm_count filled in and the
// default allocator (a cudaMallocAsync pool on that stream) unless `allocator` is given.
Context cuda_context(int index, void* stream, Allocator* allocator = nullptr);

// The default device allocator: cudaMallocAsync / cudaFreeAsync on the call's stream, from the
// device's default memory pool (whose release threshold is raised so memory stays cached).
Allocator* cuda_default_allocator(int index);

// dst = src (same dtype and shape, both contiguous), any of host->device, device->host,
// device->device, host->host; stream-ordered on ctx.stream (host copies wait for the stream).
void copy_tensor(const Context& ctx, const Tensor& dst, const Tensor& src);

// Blocks until ctx.stream has finished (tests and tools only: never called inside a forward).
void synchronize(const Context& ctx);

}  // namespace modmoe
