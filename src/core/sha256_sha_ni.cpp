// SHA-256's compression function on the x86 SHA extensions (SHA256RNDS2 runs two rounds, SHA256MSG1 and SHA256MSG2
// extend the message schedule four words at a time), written from Intel's descriptions of the instructions (the
// SDM, and Intel's paper "Intel SHA Extensions"). Only these functions are compiled for the extensions (a target
// attribute, no -msha for the build), so the library still runs on any x86-64 CPU; Sha256 calls them only where
// cpu_has_sha_ni() says the CPU has them. They give the bits of sha256_compress_portable, which
// tests/cpu/test_digest.cpp checks on the standard's examples and on random messages fed in awkward pieces.
#include "core/sha256_compress.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

namespace ht::detail {

bool cpu_has_sha_ni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & (1u << 19)) == 0) return false;  // SSE4.1
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;                  // no leaf 7
  return (ebx & (1u << 29)) != 0;                                                            // SHA
}

namespace {

// Note [SHA-NI state layout]
// SHA256RNDS2 keeps the eight working variables in two registers, highest lane first: one holds (a, b, e, f), the
// other (c, d, g, h). It takes both and W(t) + K(t) for two rounds in the low two lanes of a third (round t in lane
// 0), and returns the new (a, b, e, f). The new (c, d, g, h) after two rounds is the old (a, b, e, f) (c and d are
// the old a and b, g and h the old e and f), so four rounds are two calls with the registers' roles swapped. The
// message words sit one per lane, the earliest in lane 0, which is how SHA256MSG1 and SHA256MSG2 take them.

#define HT_SHA_NI [[gnu::target("sha,sse4.1"), gnu::always_inline]] inline

// The block's four big-endian words at `p`, W(t) in lane 0.
HT_SHA_NI __m128i load_words(const unsigned char* p) {
  const __m128i swap_bytes = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), swap_bytes);
}

// W(t..t+3) from W(t-16..t-13), W(t-12..t-9), W(t-8..t-5), W(t-4..t-1) (section 6.2.2, step 1):
// W(t) = σ1(W(t-2)) + W(t-7) + σ0(W(t-15)) + W(t-16). MSG1 adds the σ0 terms to W(t-16..t-13); W(t-7..t-4) is cut
// from the two latest registers; MSG2 adds the σ1 terms, those of W(t) and W(t+1) for W(t+2) and W(t+3).
HT_SHA_NI __m128i next_words(__m128i w16, __m128i w12, __m128i w8, __m128i w4) {
  const __m128i w7 = _mm_alignr_epi8(w4, w8, 4);  // W(t-7..t-4)
  return _mm_sha256msg2_epu32(_mm_add_epi32(_mm_sha256msg1_epu32(w16, w12), w7), w4);
}

// Rounds 4q..4q+3 on W(4q..4q+3) (Note [SHA-NI state layout]).
HT_SHA_NI void four_rounds(__m128i& abef, __m128i& cdgh, __m128i w, int q) {
  const __m128i k = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kSha256K.data() + 4 * q));
  const __m128i wk = _mm_add_epi32(w, k);
  cdgh = _mm_sha256rnds2_epu32(cdgh, abef, wk);                         // rounds 4q, 4q+1: now (a, b, e, f)
  abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(wk, 0x0e));  // 4q+2, 4q+3 (lanes 2, 3 moved down)
}

}  // namespace

[[gnu::target("sha,sse4.1")]] void sha256_compress_sha_ni(std::array<uint32_t, 8>& h, const unsigned char* blocks,
                                                          std::size_t count) {
  auto lane = [](uint32_t x) { return static_cast<int>(x); };
  __m128i abef = _mm_set_epi32(lane(h[0]), lane(h[1]), lane(h[4]), lane(h[5]));
  __m128i cdgh = _mm_set_epi32(lane(h[2]), lane(h[3]), lane(h[6]), lane(h[7]));
  for (; count > 0; --count, blocks += 64) {
    const __m128i abef_in = abef, cdgh_in = cdgh;
    __m128i w0 = load_words(blocks), w1 = load_words(blocks + 16);
    __m128i w2 = load_words(blocks + 32), w3 = load_words(blocks + 48);
    four_rounds(abef, cdgh, w0, 0);
    four_rounds(abef, cdgh, w1, 1);
    four_rounds(abef, cdgh, w2, 2);
    four_rounds(abef, cdgh, w3, 3);
    for (int q = 4; q < 16; q += 4) {  // w0..w3 roll forward: each takes the place of the words 16 before it
      w0 = next_words(w0, w1, w2, w3);
      four_rounds(abef, cdgh, w0, q);
      w1 = next_words(w1, w2, w3, w0);
      four_rounds(abef, cdgh, w1, q + 1);
      w2 = next_words(w2, w3, w0, w1);
      four_rounds(abef, cdgh, w2, q + 2);
      w3 = next_words(w3, w0, w1, w2);
      four_rounds(abef, cdgh, w3, q + 3);
    }
    abef = _mm_add_epi32(abef, abef_in);  // H(i) = H(i-1) + the working variables, section 6.2.2 step 4
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
  }
  h[0] = static_cast<uint32_t>(_mm_extract_epi32(abef, 3));
  h[1] = static_cast<uint32_t>(_mm_extract_epi32(abef, 2));
  h[4] = static_cast<uint32_t>(_mm_extract_epi32(abef, 1));
  h[5] = static_cast<uint32_t>(_mm_extract_epi32(abef, 0));
  h[2] = static_cast<uint32_t>(_mm_extract_epi32(cdgh, 3));
  h[3] = static_cast<uint32_t>(_mm_extract_epi32(cdgh, 2));
  h[6] = static_cast<uint32_t>(_mm_extract_epi32(cdgh, 1));
  h[7] = static_cast<uint32_t>(_mm_extract_epi32(cdgh, 0));
}

#undef HT_SHA_NI

}  // namespace ht::detail

#endif  // defined(__x86_64__)
