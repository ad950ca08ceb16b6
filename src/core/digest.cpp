// CRC-32 through zlib (core/digest.h).
#include "hadatrain/core/digest.h"

#include <algorithm>

#include <zlib.h>

namespace ht {

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) {
  auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib takes at most a uInt of bytes a call
    const auto k = static_cast<uInt>(std::min<std::size_t>(n, std::size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, k));
    p += k;
    n -= k;
  }
  return crc;
}

}  // namespace ht
