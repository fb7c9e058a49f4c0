#include "modmoe/dlpack.h"

#include <memory>

#include "modmoe/error.h"

namespace modmoe {

namespace {

DType dtype_from_dl(const DLDataType& t) {
  MODMOE_CHECK(t.lanes == 1) << "from_dlpack: dtype lanes must be 1, got " << t.lanes;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return DType::fp16;
      if (t.bits == 32) return DType::fp32;
      if (t.bits == 64) return DType::fp64;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::bf16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::int8;
      if (t.bits == 32) return DType::int32;
      if (t.bits == 64) return DType::int64;
      break;
    case kDLUInt:
      if (t.bits == 8) return DType::uint8;
      break;
    default: break;
  }
  MODMOE_FAIL() << "from_dlpack: unsupported DLPack dtype (code " << int(t.code) << ", bits "
                << int(t.bits) << "); expected float16/32/64, bfloat16, int8/32/64 or uint8 "
                << "(fp8 travels as uint8 and is reinterpreted by the caller)";
  return DType::fp32;
}

DLDataType dtype_to_dl(DType d) {
  switch (d) {
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::fp16: return {kDLFloat, 16, 1};
    case DType::fp32: return {kDLFloat, 32, 1};
    case DType::fp64: return {kDLFloat, 64, 1};
    case DType::int8: return {kDLInt, 8, 1};
    case DType::int32: return {kDLInt, 32, 1};
    case DType::int64: return {kDLInt, 64, 1};
    // DLPack 0.6 has no fp8/e8m0 codes: export the raw bytes.
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
    case DType::e8m0:
    case DType::uint8: return {kDLUInt, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

struct ManagedContext {
  Shape shape;
  Shape strides;
};

}  // namespace

Tensor from_dlpack(const DLTensor& dl) {
  MODMOE_CHECK(dl.ndim >= 0 && dl.ndim <= Tensor::kMaxDims)
      << "from_dlpack: ndim must be in [0, " << Tensor::kMaxDims << "], got " << dl.ndim;
  Device device;
  if (dl.device.device_type == kDLCPU || dl.device.device_type == kDLCUDAHost) {
    device = Device::cpu();
  } else if (dl.device.device_type == kDLCUDA || dl.device.device_type == kDLCUDAManaged) {
    device = Device::cuda(dl.device.device_id);
  } else {
    MODMOE_FAIL() << "from_dlpack: unsupported device type " << int(dl.device.device_type)
                  << ", expected CPU or CUDA";
  }
  const DType dtype = dtype_from_dl(dl.dtype);
  Shape shape(dl.shape, dl.shape + dl.ndim);
  Shape strides;
  if (dl.strides) {
    strides.assign(dl.strides, dl.strides + dl.ndim);
  } else {  // NULL strides mean compact row-major
    strides.resize(dl.ndim);
    int64_t s = 1;
    for (int d = dl.ndim - 1; d >= 0; --d) {
      strides[d] = s;
      s *= shape[d];
    }
  }
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  return Tensor(data, dtype, shape, strides, device);
}

DLManagedTensor* to_dlpack(const Tensor& t) {
  MODMOE_CHECK(t.defined()) << "to_dlpack: tensor is undefined";
  auto ctx = std::make_unique<ManagedContext>();
  ctx->shape = t.shape();
  ctx->strides = t.strides();
  auto managed = std::make_unique<DLManagedTensor>();
  DLTensor& dl = managed->dl_tensor;
  dl.data = t.data();
  dl.device = t.device().is_cpu() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, t.device().index};
  dl.ndim = t.ndim();
  dl.dtype = dtype_to_dl(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  managed->manager_ctx = ctx.release();
  managed->deleter = [](DLManagedTensor* self) {
    delete static_cast<ManagedContext*>(self->manager_ctx);
    delete self;
  };
  return managed.release();
}

}  // namespace modmoe
