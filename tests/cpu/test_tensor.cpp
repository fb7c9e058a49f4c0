// Tensor views, DLPack conversion both ways, the allocator types.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "modmoe/allocator.h"
#include "modmoe/dlpack.h"
#include "modmoe/error.h"
#include "modmoe/tensor.h"

namespace modmoe {
namespace {

TEST(Tensor, ContiguousViewShapesStridesAndSlices) {
  float data[2 * 3 * 4];
  Tensor t(data, DType::fp32, {2, 3, 4});
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.shape_str(), "(2, 3, 4)");
  EXPECT_EQ(t.describe(), "fp32 (2, 3, 4) on cpu");
  Tensor s = t.slice(1, 2);
  EXPECT_EQ(s.data(), data + 12);
  EXPECT_EQ(s.shape(), (Shape{1, 3, 4}));
  Tensor r = t.select(1);
  EXPECT_EQ(r.data(), data + 12);
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_EQ(t.reshape({6, 4}).shape(), (Shape{6, 4}));
  EXPECT_THROW(t.reshape({5, 4}), Error);
  EXPECT_THROW(t.slice(1, 3), Error);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor().shape_str(), "undefined");
}

TEST(Tensor, StridedViewsAndOverlap) {
  float data[16];
  Tensor transposed(data, DType::fp32, {4, 4}, {1, 4}, Device::cpu());
  EXPECT_FALSE(transposed.is_contiguous());
  Tensor a(data, DType::fp32, {2, 4}), b(data + 8, DType::fp32, {2, 4}), c(data + 6, DType::fp32, {1, 4});
  EXPECT_FALSE(a.overlaps(b));
  EXPECT_TRUE(a.overlaps(c));
  EXPECT_TRUE(b.overlaps(c));
  EXPECT_FALSE(a.overlaps(Tensor()));
  Tensor on_gpu(data, DType::fp32, {2, 4}, Device::cuda(0));
  EXPECT_FALSE(a.overlaps(on_gpu)) << "different devices never overlap";
  EXPECT_EQ(on_gpu.describe(), "fp32 (2, 4) on cuda:0");
}

TEST(Tensor, RejectsMoreThanFourDimsAndNegativeSizes) {
  float x;
  EXPECT_THROW(Tensor(&x, DType::fp32, {1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(Tensor(&x, DType::fp32, {2, -1}), Error);
}

TEST(DLPack, RoundTripKeepsDataShapeStridesDtypeAndDevice) {
  uint16_t data[6 * 5];
  for (DType d : {DType::bf16, DType::fp16}) {
    Tensor t(data, d, {6, 5}, {1, 6}, Device::cpu());  // a transposed view
    DLManagedTensor* m = to_dlpack(t);
    EXPECT_EQ(m->dl_tensor.ndim, 2);
    EXPECT_EQ(m->dl_tensor.shape[0], 6);
    EXPECT_EQ(m->dl_tensor.strides[0], 1);
    EXPECT_EQ(m->dl_tensor.dtype.code, d == DType::bf16 ? kDLBfloat : kDLFloat);
    EXPECT_EQ(m->dl_tensor.dtype.bits, 16);
    Tensor back = from_dlpack(m->dl_tensor);
    EXPECT_EQ(back.data(), t.data());
    EXPECT_EQ(back.dtype(), d);
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(back.strides(), t.strides());
    EXPECT_EQ(back.device(), Device::cpu());
    m->deleter(m);  // frees only the DLPack structs (ASan would flag a double free / leak)
  }
}

TEST(DLPack, CudaDeviceIntegerTypesAndByteOffset) {
  int64_t ids[8];
  DLTensor dl{};
  int64_t shape[2] = {2, 3};
  dl.data = ids;
  dl.device = {kDLCUDA, 1};
  dl.ndim = 2;
  dl.dtype = {kDLInt, 64, 1};
  dl.shape = shape;
  dl.strides = nullptr;  // compact row-major
  dl.byte_offset = 16;
  Tensor t = from_dlpack(dl);
  EXPECT_EQ(t.device(), Device::cuda(1));
  EXPECT_EQ(t.dtype(), DType::int64);
  EXPECT_EQ(t.strides(), (Shape{3, 1}));
  EXPECT_EQ(t.data(), ids + 2);
  // fp8 leaves as raw bytes (DLPack 0.6 has no fp8 code).
  uint8_t codes[4];
  DLManagedTensor* m = to_dlpack(Tensor(codes, DType::fp8_e4m3, {4}));
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLUInt);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 8);
  m->deleter(m);
}

TEST(DLPack, RejectsWhatModmoeCannotView) {
  float x[4];
  int64_t shape[1] = {4};
  DLTensor dl{};
  dl.data = x;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.shape = shape;
  dl.dtype = {kDLFloat, 32, 2};  // vector lanes
  try {
    from_dlpack(dl);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lanes must be 1, got 2"), std::string::npos) << e.what();
  }
  dl.dtype = {kDLComplex, 64, 1};
  EXPECT_THROW(from_dlpack(dl), Error);
  dl.dtype = {kDLFloat, 32, 1};
  dl.device = {kDLOpenCL, 0};
  try {
    from_dlpack(dl);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported device type"), std::string::npos) << e.what();
  }
}

TEST(Allocator, BufferAndOwnedTensorReleaseThroughTheirAllocator) {
  struct Counting final : Allocator {
    void* allocate(size_t b, void* s) override { ++live; return host_allocator()->allocate(b, s); }
    void deallocate(void* p, size_t b, void* s) override { --live; host_allocator()->deallocate(p, b, s); }
    Device device() const override { return Device::cpu(); }
    int live = 0;
  } alloc;
  {
    OwnedTensor t(&alloc, DType::bf16, {3, 7});
    EXPECT_EQ(alloc.live, 1);
    EXPECT_EQ(t.tensor().shape(), (Shape{3, 7}));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.tensor().data()) % 64, 0u);
    OwnedTensor moved = std::move(t);
    EXPECT_EQ(alloc.live, 1);
  }
  EXPECT_EQ(alloc.live, 0);
}

}  // namespace
}  // namespace modmoe
