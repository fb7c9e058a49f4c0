// Batched scatter/gather and packing (see batched.h). Integer index arithmetic and byte copies
// only: exact and deterministic.
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <limits>

#include "cuda/batched.h"
#include "cuda/cuda_check.h"
#include "cuda/float_io.cuh"
#include "cuda/programmatic_launch.cuh"
#include "modmoe/error.h"

namespace modmoe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;

int grid_for(int64_t work) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(blocks_for(work, kThreads), kMaxBlocks)));
}

__global__ void batched_slots_kernel(const int32_t* __restrict__ row_of_pair,
                                     const int32_t* __restrict__ sorted_expert,
                                     const int32_t* __restrict__ m_indptr, int64_t num_pairs,
                                     int64_t T, int32_t* __restrict__ batched_row) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < num_pairs;
       p += int64_t{gridDim.x} * blockDim.x) {
    const int32_t r = row_of_pair[p];
    int64_t row = -1;
    if (r >= 0) {
      const int32_t e = sorted_expert[r];
      const int64_t slot = r - m_indptr[e];
      if (slot < T) row = e * T + slot;
    }
    batched_row[p] = static_cast<int32_t>(row);
  }
}

__global__ void expert_counts_kernel(const int32_t* __restrict__ m_indptr, int64_t E_local,
                                     int64_t T, int32_t* __restrict__ counts) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= E_local) return;
  const int64_t n = m_indptr[e + 1] - m_indptr[e];
  counts[e] = static_cast<int32_t>(n < T ? n : T);
}

// One copy of rows by batched_row, in units of V: the flattened (row, unit) index space of its
// total_units.
template <typename Index>
struct CopyTable {
  const char* src;
  int64_t src_stride;
  char* dst;
  int64_t dst_stride;
  Index units_per_row, total_units;
};

// One thread per (row, unit) of the flattened copy (a grid-stride loop past 65535 blocks): a
// row's units are spread over lanes whatever the row length. One block per row left a 64-byte
// scale row to 4 threads of a 32-thread block: 42 us for Qwen3-30B's 65536 pairs at M = 8192 on
// the H200, 5.6 us flattened (docs/perf.md). Four units a thread, loaded before any store, ran
// no faster (Mixtral bf16 M = 1024's gather 10.0 against 9.4 us; perf.md, twenty-sixth
// session). Index is int32_t when every unit index fits. Two tables by the same rows (a gather
// of rows and of their scale rows) run in one launch: t1's units follow t0's (t1.total_units =
// 0 for one table).
template <typename V, typename Index>
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(const CopyTable<Index> t0, const CopyTable<Index> t1,
                     const int32_t* __restrict__ batched_row, Index topk, bool gather) {
  // A kernel launched programmatically after this one (Sm90Experts' decode-sized GEMM1 after the
  // gather) may start now: it waits for this grid before reading what it writes.
  allow_dependent_launch();
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  const Index total = t0.total_units + t1.total_units;
  for (Index g = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; g < total; g += stride) {
    // Field by field, so the tables stay kernel parameters (no local copy to index).
    const bool second = g >= t0.total_units;
    const Index i = second ? g - t0.total_units : g;
    const Index units_per_row = second ? t1.units_per_row : t0.units_per_row;
    const Index p = i / units_per_row, u = i - p * units_per_row;
    int64_t s, d;
    if (gather) {
      s = batched_row[p];
      d = p;
    } else {
      d = batched_row[p];
      if (d < 0) continue;
      s = p / topk;
    }
    V* to = reinterpret_cast<V*>((second ? t1.dst : t0.dst) +
                                 d * (second ? t1.dst_stride : t0.dst_stride)) +
            u;
    const char* from_row =
        (second ? t1.src : t0.src) + s * (second ? t1.src_stride : t0.src_stride);
    *to = s < 0 ? V{} : reinterpret_cast<const V*>(from_row)[u];
  }
}

void check_row_copy(const char* fn, const RowCopy& c) {
  MODMOE_CHECK(c.row_bytes >= 0 && c.src_stride >= c.row_bytes && c.dst_stride >= c.row_bytes)
      << fn << ": strides must be >= row_bytes = " << c.row_bytes
      << ", got src_stride = " << c.src_stride << ", dst_stride = " << c.dst_stride;
}

// The widest unit (16, 8, 4, 2 or 1 bytes) that divides both pointers, both strides and the row.
int copy_unit(const RowCopy& c) {
  int unit = 16;
  while (unit > 1 &&
         !(is_aligned(c.src, unit) && is_aligned(c.dst, unit) && c.src_stride % unit == 0 &&
           c.dst_stride % unit == 0 && c.row_bytes % unit == 0))
    unit /= 2;
  return unit;
}

// One launch copying `tables` (one or two) in units of `unit` bytes.
void launch_copy(const RowCopy* tables, int count, int unit, const int32_t* batched_row,
                 int64_t num_pairs, int64_t topk, bool gather, cudaStream_t stream) {
  int64_t units[2] = {0, 0};
  for (int i = 0; i < count; ++i) units[i] = tables[i].row_bytes / unit;
  const int64_t total = (units[0] + units[1]) * num_pairs;
  const int blocks = grid_for(total);
  auto launch = [&](auto tag) {
    using V = typename decltype(tag)::type;
    const auto run = [&](auto index_tag) {
      using Index = decltype(index_tag);
      CopyTable<Index> t[2] = {};
      for (int i = 0; i < count; ++i) {
        t[i] = {static_cast<const char*>(tables[i].src),
                tables[i].src_stride,
                static_cast<char*>(tables[i].dst),
                tables[i].dst_stride,
                static_cast<Index>(units[i]),
                static_cast<Index>(units[i] * num_pairs)};
      }
      t[1].units_per_row = std::max<Index>(t[1].units_per_row, 1);  // never divided by 0
      copy_rows_kernel<V, Index><<<blocks, kThreads, 0, stream>>>(t[0], t[1], batched_row,
                                                                  static_cast<Index>(topk), gather);
    };
    // int32 division when the last index of the grid-stride loop still fits.
    if (total + int64_t{kThreads} * kMaxBlocks < std::numeric_limits<int32_t>::max())
      run(int32_t{});
    else
      run(int64_t{});
  };
  switch (unit) {
    case 16:
      launch(TypeTag<uint4>{});
      break;
    case 8:
      launch(TypeTag<uint2>{});
      break;
    case 4:
      launch(TypeTag<uint32_t>{});
      break;
    case 2:
      launch(TypeTag<uint16_t>{});
      break;
    default:
      launch(TypeTag<uint8_t>{});
      break;
  }
  MODMOE_CUDA_CHECK_LAUNCH();
}

// Copies one or two tables by the same batched_row: in one launch when a common unit is as wide
// as each table's own, else one launch per table (a 92-byte scale row must not narrow the copy
// of its 2880-byte rows to 4-byte units).
void copy_rows(const char* fn, const RowCopy* tables, int count, const int32_t* batched_row,
               int64_t num_pairs, int64_t topk, bool gather, cudaStream_t stream) {
  MODMOE_CHECK(count == 1 || count == 2) << fn << ": one or two tables, got " << count;
  for (int i = 0; i < count; ++i) check_row_copy(fn, tables[i]);
  MODMOE_CHECK(num_pairs >= 0 && topk >= 1)
      << fn << ": need num_pairs >= 0 and topk >= 1, got " << num_pairs << ", " << topk;
  RowCopy work[2];
  int n = 0;
  for (int i = 0; i < count; ++i)
    if (tables[i].row_bytes > 0) work[n++] = tables[i];
  if (num_pairs == 0 || n == 0) return;
  for (int i = 0; i < n; ++i)
    MODMOE_CHECK(work[i].src != nullptr && work[i].dst != nullptr && batched_row != nullptr)
        << fn << ": src, dst and batched_row must not be null";
  const int unit0 = copy_unit(work[0]);
  if (n == 2 && copy_unit(work[1]) < unit0) {
    launch_copy(&work[0], 1, unit0, batched_row, num_pairs, topk, gather, stream);
    launch_copy(&work[1], 1, copy_unit(work[1]), batched_row, num_pairs, topk, gather, stream);
    return;
  }
  launch_copy(work, n, unit0, batched_row, num_pairs, topk, gather, stream);
}

// counts = clamp(expert_num_tokens, 0, T) cut at max_rows in total, m_indptr = their exclusive
// prefix sum (one block, tiles of kThreads experts with a running carry).
__global__ void pack_scan_kernel(const int32_t* __restrict__ expert_num_tokens, int32_t E_local,
                                 int32_t T, int32_t max_rows, int32_t* __restrict__ counts,
                                 int32_t* __restrict__ m_indptr) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t carry;
  if (threadIdx.x == 0) {
    carry = 0;
    m_indptr[0] = 0;
  }
  __syncthreads();
  for (int32_t base = 0; base < E_local; base += kThreads) {
    const int32_t e = base + threadIdx.x;
    int32_t n = 0;
    if (e < E_local) {
      n = expert_num_tokens[e];
      n = n < 0 ? 0 : (n > T ? T : n);
    }
    int32_t inclusive = 0, total = 0;
    Scan(temp).InclusiveSum(n, inclusive, total);
    if (e < E_local) {
      // carry + inclusive <= E_local * T < 2^31 (checked on the host): no overflow.
      const int32_t end = min(carry + inclusive, max_rows);
      const int32_t begin = min(carry + inclusive - n, max_rows);
      counts[e] = end - begin;
      m_indptr[e + 1] = end;
    }
    __syncthreads();  // every thread has read `carry` and the scan storage is free again
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

// grid (row tiles of T, E_local).
__global__ void pack_rows_kernel(const int32_t* __restrict__ counts,
                                 const int32_t* __restrict__ m_indptr, int64_t T,
                                 int32_t* __restrict__ packed_to_batched,
                                 int32_t* __restrict__ batched_to_packed) {
  const int64_t e = blockIdx.y;
  const int64_t n = counts[e];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t packed = m_indptr[e] + i, batched = e * T + i;
    packed_to_batched[packed] = static_cast<int32_t>(batched);
    batched_to_packed[batched] = static_cast<int32_t>(packed);
  }
}

void check_batched_size(const char* fn, int64_t E_local, int64_t T) {
  MODMOE_CHECK(E_local >= 1 && T >= 0 && E_local * T < std::numeric_limits<int32_t>::max())
      << fn << ": need E_local >= 1, T >= 0 and E_local * T < 2^31 - 1, got E_local = " << E_local
      << ", T = " << T;
}

}  // namespace

void batched_slots(const PermuteWorkspace& perm, int64_t T, int32_t* batched_row,
                   int32_t* expert_num_tokens, cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::batched_slots";
  check_batched_size(kFn, perm.num_local_experts, T);
  if (batched_row != nullptr && perm.num_pairs > 0) {
    batched_slots_kernel<<<grid_for(perm.num_pairs), kThreads, 0, stream>>>(
        perm.row_of_pair, perm.sorted_expert, perm.m_indptr, perm.num_pairs, T, batched_row);
    MODMOE_CUDA_CHECK_LAUNCH();
  }
  if (expert_num_tokens != nullptr) {
    expert_counts_kernel<<<blocks_for(perm.num_local_experts, kThreads), kThreads, 0, stream>>>(
        perm.m_indptr, perm.num_local_experts, T, expert_num_tokens);
    MODMOE_CUDA_CHECK_LAUNCH();
  }
}

void batched_scatter_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                          int64_t row_bytes, const int32_t* batched_row, int64_t num_pairs,
                          int64_t topk, cudaStream_t stream) {
  const RowCopy table{src, src_stride, dst, dst_stride, row_bytes};
  copy_rows("cuda::batched_scatter_rows", &table, 1, batched_row, num_pairs, topk,
            /*gather=*/false, stream);
}

void batched_gather_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride,
                         int64_t row_bytes, const int32_t* batched_row, int64_t num_pairs,
                         cudaStream_t stream) {
  const RowCopy table{src, src_stride, dst, dst_stride, row_bytes};
  copy_rows("cuda::batched_gather_rows", &table, 1, batched_row, num_pairs, /*topk=*/1,
            /*gather=*/true, stream);
}

void batched_gather_rows(const RowCopy& a, const RowCopy& b, const int32_t* batched_row,
                         int64_t num_pairs, cudaStream_t stream) {
  const RowCopy tables[2] = {a, b};
  copy_rows("cuda::batched_gather_rows", tables, 2, batched_row, num_pairs, /*topk=*/1,
            /*gather=*/true, stream);
}

void batched_pack_indices(const int32_t* expert_num_tokens, int64_t E_local, int64_t T,
                          int64_t max_rows, int32_t* counts, int32_t* m_indptr,
                          int32_t* packed_to_batched, int32_t* batched_to_packed,
                          cudaStream_t stream) {
  static constexpr const char* kFn = "cuda::batched_pack_indices";
  check_batched_size(kFn, E_local, T);
  MODMOE_CHECK(max_rows >= 0) << kFn << ": max_rows must be >= 0, got " << max_rows;
  max_rows = std::min(max_rows, E_local * T);
  MODMOE_CHECK(E_local <= kMaxBlocks)
      << kFn << ": E_local must be <= " << kMaxBlocks << ", got " << E_local;
  MODMOE_CHECK(expert_num_tokens && counts && m_indptr && packed_to_batched && batched_to_packed)
      << kFn << ": pointers must not be null";
  pack_scan_kernel<<<1, kThreads, 0, stream>>>(expert_num_tokens, static_cast<int32_t>(E_local),
                                               static_cast<int32_t>(T),
                                               static_cast<int32_t>(max_rows), counts, m_indptr);
  MODMOE_CUDA_CHECK_LAUNCH();
  if (T == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks_for(T, kThreads), kMaxBlocks)),
                  static_cast<unsigned>(E_local));
  pack_rows_kernel<<<grid, kThreads, 0, stream>>>(counts, m_indptr, T, packed_to_batched,
                                                  batched_to_packed);
  MODMOE_CUDA_CHECK_LAUNCH();
}

}  // namespace modmoe::cuda
