// Session 31 check (CPU, no GPU): is the FMA division by the constant 448 — q0 = a * RN(1/448),
// q = fma(fma(-q0, 448, a), RN(1/448), q0) — the correctly rounded a / 448 for every finite
// a >= 0? The reference is a / 448 in double rounded to float (correctly rounded: 53 >= 2 * 24 + 2).
// Result (2026-12-04): 599 186 mismatches, every one with a subnormal quotient (docs/perf.md,
// thirty-first session, Next). Build: g++ -O2 div448_check.cpp -o div448_check (~13 s to run).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

static float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
static uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

int main() {
  const float r = static_cast<float>(1.0 / 448.0);
  uint64_t bad = 0, bad_normal = 0;
  for (uint64_t i = 0; i < 0x7f800000ull; ++i) {
    const float a = from_bits(static_cast<uint32_t>(i));
    const float ref = static_cast<float>(static_cast<double>(a) / 448.0);
    const float q0 = a * r;
    const float q = std::fmaf(std::fmaf(-q0, 448.0f, a), r, q0);
    if (bits(q) != bits(ref)) {
      ++bad;
      if (ref >= 1.17549435e-38f) ++bad_normal;
    }
  }
  std::printf("a / 448 by two FMAs: %llu mismatches, %llu of them with a normal quotient\n",
              static_cast<unsigned long long>(bad), static_cast<unsigned long long>(bad_normal));
  return bad_normal == 0 ? 0 : 1;
}
