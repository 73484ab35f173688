// Portable, seedable randomness. The loader's sample order and augmentations must be the same on
// every machine and standard library, so nothing here uses std:: distributions (their algorithms
// are implementation-defined); only fixed integer arithmetic.
#pragma once

#include <cstdint>
#include <utility>

namespace zerowait::internal {

// SplitMix64 finaliser: a bijective 64-bit mix (Steele, Lea, Flood 2014).
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One seed from several values (seed, epoch, sample, purpose...), order-sensitive.
constexpr uint64_t combine_seed(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }
constexpr uint64_t combine_seed(uint64_t a, uint64_t b, uint64_t c) {
  return combine_seed(combine_seed(a, b), c);
}

// xoshiro256** (Blackman, Vigna), seeded through SplitMix64 as its authors recommend.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& word : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      word = mix64(seed - 0x9e3779b97f4a7c15ULL);
    }
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound > 0, without modulo bias (Lemire's multiply-and-reject).
  uint64_t below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform in [0, 1) with 53 random bits.
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Fisher-Yates shuffle of [first, last) with `rng`.
template <typename It>
void shuffle_range(It first, It last, Rng& rng) {
  const auto n = static_cast<uint64_t>(last - first);
  for (uint64_t i = n; i > 1; --i) {
    const uint64_t j = rng.below(i);
    using std::swap;
    swap(first[i - 1], first[j]);
  }
}

}  // namespace zerowait::internal
