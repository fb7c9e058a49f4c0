// The three implementations of cuda::permute (src/cuda/permute.h) on the same inputs:
//   single_block  the one-launch counting sort for small problems (decode)
//   multi_block   the same counting sort by up to 64 blocks after a counting launch
//   radix_sort    CUB DeviceRadixSort + two kernels
// must give identical outputs (m_indptr, sorted_pair, sorted_expert, sorted_token, row_of_pair),
// and each must equal a host counting sort. The routings mix local pairs, pairs mapped to -1,
// ids outside [0, E) and map entries outside [0, E_local), skewed towards a few experts so that
// many equal keys meet in one warp. Sizes cover E_local in {1, 8, 256, 1000, 1024} and
// num_pairs in {1, 7, 1024, 8192} for the single block (8192 x 1000: fewer segments than warps,
// segments not a multiple of 32) and up to 524288 for the multi-block sort, with int32 and
// int64 ids. Outputs live in workspaces poisoned with 0x5a bytes.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/byte_carver.h"
#include "cuda/cuda_session.h"
#include "cuda/gpu_test.h"
#include "cuda/permute.h"
#include "modmoe/allocator.h"

namespace modmoe {
namespace {

using ::modmoe::testing::CudaSession;
using ::modmoe::testing::error_of;
using ::testing::HasSubstr;

struct Routing {
  int64_t M, topk, E, E_local;
  std::vector<int64_t> ids;  // (M * topk) global ids, some outside [0, E)
  std::vector<int32_t> map;  // (E) or empty (no expert map: local = id)

  // The sort key of pair p as permute.h defines it: the local expert, or E_local.
  int64_t key(int64_t p) const {
    const int64_t id = ids[p];
    int64_t local = -1;
    if (id >= 0 && id < E) local = map.empty() ? id : map[id];
    return local >= 0 && local < E_local ? local : E_local;
  }
};

// Skewed random routing: half the pairs go to a "hot" quarter of the global experts, and about
// 1 in 16 pairs has an id outside [0, E). With a map, about half of the global experts are
// local (in random order), a few entries point past E_local and the rest are -1.
Routing random_routing(int64_t M, int64_t topk, int64_t E_local, bool with_map, std::mt19937& rng) {
  Routing r{M, topk, with_map ? 2 * E_local + 3 : E_local, E_local, {}, {}};
  std::uniform_int_distribution<int64_t> any(0, r.E - 1), hot(0, (r.E - 1) / 4), bad(0, 1),
      pick(0, 15);
  r.ids.resize(M * topk);
  for (int64_t& id : r.ids) {
    const int64_t c = pick(rng);
    id = c == 0 ? (bad(rng) ? -1 : r.E + any(rng)) : c < 8 ? hot(rng) : any(rng);
  }
  if (with_map) {
    std::vector<int64_t> order(r.E);
    for (int64_t e = 0; e < r.E; ++e) order[e] = e;
    std::shuffle(order.begin(), order.end(), rng);
    r.map.assign(r.E, -1);
    for (int64_t l = 0; l < E_local; ++l) r.map[order[l]] = static_cast<int32_t>(l);
    r.map[order[E_local]] = static_cast<int32_t>(E_local);  // past E_local: not local
    r.map[order[E_local + 1]] = static_cast<int32_t>(E_local + 7);
  }
  return r;
}

struct Outputs {
  std::vector<int32_t> m_indptr, sorted_pair, sorted_expert, sorted_token, row_of_pair;
};

// A stable host counting sort: expert 0's pairs in pair order, ..., then the non-local ones.
Outputs host_permute(const Routing& r) {
  const int64_t P = r.M * r.topk;
  Outputs h;
  h.m_indptr.assign(r.E_local + 1, 0);
  std::vector<int64_t> next(r.E_local + 2, 0);
  for (int64_t p = 0; p < P; ++p) ++next[r.key(p) + 1];
  for (int64_t e = 0; e <= r.E_local; ++e) {
    next[e + 1] += next[e];
    h.m_indptr[e] = static_cast<int32_t>(next[e]);
  }
  h.sorted_pair.assign(P, -2);
  h.sorted_expert.assign(P, -2);
  h.sorted_token.assign(P, -2);
  h.row_of_pair.assign(P, -2);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t e = r.key(p);
    const int64_t row = next[e]++;
    h.sorted_pair[row] = static_cast<int32_t>(p);
    h.sorted_expert[row] = static_cast<int32_t>(e);
    h.sorted_token[row] = static_cast<int32_t>(p / r.topk);
    h.row_of_pair[p] = e < r.E_local ? static_cast<int32_t>(row) : -1;
  }
  return h;
}

template <typename T>
std::vector<T> download(const CudaSession& s, const T* device, int64_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(
        cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, s.stream()),
        cudaSuccess);
  }
  s.sync();
  return host;
}

// Routing inputs on the device.
struct DeviceRouting {
  OwnedTensor ids, map;
  DeviceRouting(const CudaSession& s, const Routing& r, bool int64_ids) {
    OwnedTensor host_ids = host_tensor(int64_ids ? DType::int64 : DType::int32, {r.M, r.topk});
    for (size_t p = 0; p < r.ids.size(); ++p) {
      if (int64_ids) {
        host_ids.data_ptr<int64_t>()[p] = r.ids[p];
      } else {
        host_ids.data_ptr<int32_t>()[p] = static_cast<int32_t>(r.ids[p]);
      }
    }
    ids = s.to_device(host_ids);
    if (!r.map.empty()) {
      OwnedTensor host_map = host_tensor(DType::int32, {r.E});
      std::copy(r.map.begin(), r.map.end(), host_map.data_ptr<int32_t>());
      map = s.to_device(host_map);
    }
  }
  cuda::PermuteArgs args(const Routing& r, cuda::PermutePath path) const {
    cuda::PermuteArgs a;
    a.topk_ids = ids.tensor().data();
    a.ids_dtype = ids.tensor().dtype();
    a.num_tokens = r.M;
    a.topk = r.topk;
    a.expert_map = map.tensor().defined() ? map.data_ptr<int32_t>() : nullptr;
    a.num_experts = r.E;
    a.num_local_experts = r.E_local;
    a.force_path = path;
    return a;
  }
};

// A PermuteWorkspace in its own device buffer, every byte 0x5a (no valid index has them).
struct DeviceWorkspace {
  OwnedTensor buffer;
  cuda::PermuteWorkspace ws;
  DeviceWorkspace(const CudaSession& s, int64_t pairs, int64_t E_local) {
    cuda::ByteCarver sizing(nullptr);
    cuda::PermuteWorkspace::carve(sizing, pairs, E_local);
    buffer = s.empty(DType::uint8, {static_cast<int64_t>(sizing.size())});
    EXPECT_EQ(cudaMemsetAsync(buffer.tensor().data(), 0x5a, sizing.size(), s.stream()),
              cudaSuccess);
    cuda::ByteCarver carver(buffer.tensor().data());
    ws = cuda::PermuteWorkspace::carve(carver, pairs, E_local);
  }
  Outputs download_all(const CudaSession& s) const {
    const int64_t P = ws.num_pairs;
    return {download(s, ws.m_indptr, ws.num_local_experts + 1), download(s, ws.sorted_pair, P),
            download(s, ws.sorted_expert, P), download(s, ws.sorted_token, P),
            download(s, ws.row_of_pair, P)};
  }
};

void expect_same(const Outputs& got, const Outputs& want, const std::string& what) {
  EXPECT_EQ(got.m_indptr, want.m_indptr) << what << ": m_indptr";
  EXPECT_EQ(got.sorted_pair, want.sorted_pair) << what << ": sorted_pair";
  EXPECT_EQ(got.sorted_expert, want.sorted_expert) << what << ": sorted_expert";
  EXPECT_EQ(got.sorted_token, want.sorted_token) << what << ": sorted_token";
  EXPECT_EQ(got.row_of_pair, want.row_of_pair) << what << ": row_of_pair";
}

struct Pairs {
  int64_t M, topk;
};

// One random routing through `path` and through the radix sort; both must equal the host sort.
// Without a map every id is its own local expert; with one (int64 ids, or E_local = 1), E >
// E_local.
void expect_path_matches_radix_and_host(const CudaSession& s, cuda::PermutePath path,
                                        const std::string& path_name, const Pairs& pc,
                                        int64_t E_local, bool int64_ids, unsigned seed) {
  const bool with_map = int64_ids || E_local == 1;
  std::mt19937 rng(seed);
  const Routing r = random_routing(pc.M, pc.topk, E_local, with_map, rng);
  const int64_t P = pc.M * pc.topk;
  const std::string where = "pairs=" + std::to_string(P) + " (M=" + std::to_string(pc.M) +
                            " topk=" + std::to_string(pc.topk) + ") E=" + std::to_string(r.E) +
                            " E_local=" + std::to_string(E_local) +
                            (int64_ids ? " int64" : " int32") + (with_map ? " map" : " no map") +
                            " seed=" + std::to_string(seed);
  const DeviceRouting d(s, r, int64_ids);
  DeviceWorkspace got(s, P, E_local), radix(s, P, E_local);
  cuda::permute(d.args(r, path), got.ws, s.stream());
  cuda::permute(d.args(r, cuda::PermutePath::radix_sort), radix.ws, s.stream());
  const Outputs out = got.download_all(s);
  expect_same(out, radix.download_all(s), where + " " + path_name + " vs radix_sort");
  expect_same(out, host_permute(r), where + " " + path_name + " vs host");
}

// Every (E_local, pair count, id width) of a sweep through `path`, which must take each of them
// (`fits`); the seed mixes the case with the sweep's own primes, so the two sweeps draw
// different routings.
template <typename Fits>
void expect_sweep_matches_radix_and_host(const CudaSession& s, cuda::PermutePath path,
                                         const std::string& path_name,
                                         const std::vector<Pairs>& pair_counts, Fits&& fits,
                                         unsigned e_prime, unsigned m_prime, unsigned int64_salt) {
  for (const int64_t E_local : {1, 8, 256, 1000, 1024}) {
    for (const Pairs& pc : pair_counts) {
      for (const bool int64_ids : {false, true}) {
        ASSERT_TRUE(fits(pc.M * pc.topk, E_local)) << path_name << " " << pc.M * pc.topk;
        expect_path_matches_radix_and_host(
            s, path, path_name, pc, E_local, int64_ids,
            static_cast<unsigned>(E_local * e_prime + pc.M * m_prime + pc.topk +
                                  (int64_ids ? int64_salt : 0)));
      }
    }
  }
}

// E_local = 1024 at 8192 pairs: the fewest segments (15) and the most shared memory (~90 KB).
TEST(CudaPermutePaths, SingleBlockAndRadixSortGiveIdenticalOutputs) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  expect_sweep_matches_radix_and_host(s, cuda::PermutePath::single_block, "single_block",
                                      {{1, 1}, {1, 7}, {128, 8}, {1024, 8}},
                                      cuda::permute_single_block_fits, 7919, 31, 1000003);
}

// The multi-block counting sort against the radix path and the host, from 1 pair (one block)
// to 100003 (64 blocks of 1563, the last one shorter) and 524288 (its limit: 64 blocks of 8192,
// the most shared memory a block takes at E_local = 1024), E_local up to 1024 (the fewest
// segments per block), int32 and int64 ids.
TEST(CudaPermutePaths, MultiBlockGivesIdenticalOutputs) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  expect_sweep_matches_radix_and_host(
      s, cuda::PermutePath::multi_block, "multi_block",
      {{1, 1}, {1, 7}, {1024, 8}, {8192, 8}, {100003, 1}, {65536, 8}},
      cuda::permute_multi_block_fits, 7907, 37, 1000033);
}

// The automatic choice takes the single block up to 2048 pairs, the multi-block sort past that
// while it fits, then the radix sort, with the same result on either side of each limit;
// forcing a counting sort past its limits is an error.
TEST(CudaPermutePaths, AutomaticChoiceAndLimits) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  EXPECT_TRUE(cuda::permute_single_block_fits(8192, 1024));
  EXPECT_FALSE(cuda::permute_single_block_fits(8193, 1024));
  EXPECT_FALSE(cuda::permute_single_block_fits(8192, 1025));
  // The automatic choice stops at 2048 pairs (the one block's scattered writes, perf.md).
  EXPECT_TRUE(cuda::permute_single_block_preferred(2048, 1024));
  EXPECT_FALSE(cuda::permute_single_block_preferred(2049, 16));
  EXPECT_FALSE(cuda::permute_single_block_preferred(16, 1025));
  EXPECT_TRUE(cuda::permute_multi_block_fits(64 * 8192, 1024));
  EXPECT_FALSE(cuda::permute_multi_block_fits(64 * 8192 + 1, 16));
  EXPECT_FALSE(cuda::permute_multi_block_fits(4096, 1025));

  struct Case {
    int64_t M, topk, E_local;
  };
  for (const Case& c : {Case{256, 8, 1024}, Case{257, 8, 16}, Case{1024, 8, 1024},
                        Case{1025, 8, 16}, Case{3, 8, 1025}, Case{65537, 8, 16}}) {
    const unsigned seed = static_cast<unsigned>(c.M * 13 + c.E_local);
    std::mt19937 rng(seed);
    const Routing r = random_routing(c.M, c.topk, c.E_local, /*with_map=*/true, rng);
    const int64_t P = c.M * c.topk;
    const std::string where = "pairs=" + std::to_string(P) +
                              " E_local=" + std::to_string(c.E_local) +
                              " seed=" + std::to_string(seed);
    const DeviceRouting d(s, r, /*int64_ids=*/false);
    DeviceWorkspace automatic(s, P, c.E_local);
    cuda::permute(d.args(r, cuda::PermutePath::automatic), automatic.ws, s.stream());
    expect_same(automatic.download_all(s), host_permute(r), where + " automatic vs host");
    if (!cuda::permute_single_block_fits(P, c.E_local)) {
      DeviceWorkspace forced(s, P, c.E_local);
      EXPECT_THAT(error_of([&] {
                    cuda::permute(d.args(r, cuda::PermutePath::single_block), forced.ws,
                                  s.stream());
                  }),
                  HasSubstr("force_path = single_block needs num_pairs <= 8192"))
          << where;
    }
    if (!cuda::permute_multi_block_fits(P, c.E_local)) {
      DeviceWorkspace forced(s, P, c.E_local);
      EXPECT_THAT(error_of([&] {
                    cuda::permute(d.args(r, cuda::PermutePath::multi_block), forced.ws, s.stream());
                  }),
                  HasSubstr("force_path = multi_block needs num_pairs <= 524288"))
          << where;
    }
  }
}

// No pairs: every path leaves an all-zero m_indptr.
TEST(CudaPermutePaths, NoPairsOnEitherPath) {
  MODMOE_REQUIRE_GPU();
  CudaSession s;
  for (const cuda::PermutePath path :
       {cuda::PermutePath::single_block, cuda::PermutePath::radix_sort,
        cuda::PermutePath::multi_block}) {
    DeviceWorkspace w(s, 0, 5);
    cuda::PermuteArgs a;
    a.num_tokens = 0;
    a.topk = 4;
    a.num_experts = 5;
    a.num_local_experts = 5;
    a.force_path = path;
    cuda::permute(a, w.ws, s.stream());
    EXPECT_EQ(download(s, w.ws.m_indptr, 6), std::vector<int32_t>(6, 0));
  }
}

}  // namespace
}  // namespace modmoe
