// JPEG decoding/encoding through libjpeg(-turbo), PNG decoding through libpng when available (to Pillow's pixels:
// Note [PNG as PIL decodes it]), and format sniffing. Note [libjpeg errors] and Note [libpng errors] say how the
// libraries' fatal errors become exceptions.
#include "hadatrain/data/image_codec.h"

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>
#if defined(HADATRAIN_HAVE_PNG)
#include <png.h>
#endif

#include "hadatrain/core/error.h"

namespace ht::data {
namespace {

// Note [libjpeg errors]
// libjpeg reports a fatal error by calling err->error_exit, which by default prints and calls exit(). We
// replace it with a function that formats the message into the error manager and longjmp()s back to the
// setjmp() of the phase being run. C++ exceptions must not cross libjpeg's C frames (they are built without
// unwind tables), and longjmp must not skip C++ destructors, so every libjpeg call happens inside one of the
// small C-style functions below (jpeg_*_phase): they hold no objects with destructors, call setjmp first,
// and return a status. Their C++ callers turn a failure into ht::Error naming the file. The decompress
// struct itself lives in the caller, which destroys it on every path (JpegDecompressGuard).
// libjpeg's warnings go to emit_message (level -1). "Premature end of JPEG file" (JWRN_JPEG_EOF: libjpeg
// would pad the image with grey) is treated as fatal: a truncated file is an error, not a half-grey
// sample. Other warnings (corrupt-data notes that PIL ignores too) are counted and otherwise ignored.
struct JpegErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg sees a jpeg_error_mgr*
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

extern "C" void jpeg_error_exit_longjmp(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

extern "C" void jpeg_emit_message_quiet(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  if (level >= 0) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    (*cinfo->err->format_message)(cinfo, err->message);
    std::strncat(err->message, " (the file is truncated)", JMSG_LENGTH_MAX - std::strlen(err->message) - 1);
    std::longjmp(err->jump, 1);
  }
  cinfo->err->num_warnings++;
}

void install_error_manager(jpeg_common_struct* cinfo, JpegErrorManager* err) {
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = jpeg_error_exit_longjmp;
  err->pub.emit_message = jpeg_emit_message_quiet;
  err->message[0] = '\0';
}

// ---- C-style phases (Note [libjpeg errors]): no C++ objects with destructors inside. ----

int jpeg_create_decompress_phase(jpeg_decompress_struct* cinfo, JpegErrorManager* err) {
  install_error_manager(reinterpret_cast<jpeg_common_struct*>(cinfo), err);
  if (setjmp(err->jump)) return 1;
  jpeg_create_decompress(cinfo);
  return 0;
}

int jpeg_header_phase(jpeg_decompress_struct* cinfo, JpegErrorManager* err, const unsigned char* data,
                      unsigned long size, long min_side) {
  if (setjmp(err->jump)) return 1;
  jpeg_mem_src(cinfo, data, size);
  jpeg_read_header(cinfo, TRUE);
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE: cinfo->out_color_space = JCS_GRAYSCALE; break;
    case JCS_CMYK:
    case JCS_YCCK: cinfo->out_color_space = JCS_CMYK; break;  // libjpeg converts YCCK to CMYK
    default: cinfo->out_color_space = JCS_RGB; break;
  }
  if (min_side > 0) {
    for (unsigned denom = 8; denom >= 2; denom /= 2) {
      const long w = static_cast<long>((cinfo->image_width + denom - 1) / denom);
      const long h = static_cast<long>((cinfo->image_height + denom - 1) / denom);
      if (w >= min_side && h >= min_side) {
        cinfo->scale_num = 1;
        cinfo->scale_denom = denom;
        break;
      }
    }
  }
  jpeg_calc_output_dimensions(cinfo);
  return 0;
}

int jpeg_decompress_phase(jpeg_decompress_struct* cinfo, JpegErrorManager* err, unsigned char* out,
                          std::size_t row_bytes) {
  if (setjmp(err->jump)) return 1;
  jpeg_start_decompress(cinfo);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = out + static_cast<std::size_t>(cinfo->output_scanline) * row_bytes;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_decompress(cinfo);
  return 0;
}

struct JpegDecompressGuard {
  jpeg_decompress_struct* cinfo = nullptr;
  ~JpegDecompressGuard() {
    if (cinfo) jpeg_destroy_decompress(cinfo);
  }
};

[[noreturn]] void jpeg_fail(const std::string& name, const char* stage, const JpegErrorManager& err) {
  HT_FAIL("{}: cannot decode JPEG ({}): {}", name, stage, err.message);
}

uint8_t mul255(unsigned a, unsigned b) { return static_cast<uint8_t>((a * b + 127) / 255); }

// The most pixels a decoded image may have (2^27, e.g. 11585 x 11585): far beyond any training image, and the
// buffer is sized from the header, so a corrupt or hostile header must not make the decoder allocate gigabytes.
constexpr int64_t kMaxImagePixels = int64_t{1} << 27;
void check_image_size(int64_t w, int64_t h, const std::string& name, const char* format) {
  HT_CHECK(w > 0 && h > 0 && w * h <= kMaxImagePixels,
           "{}: the {} header gives {} x {} pixels; hadatrain decodes images of at most {} pixels (is the file "
           "damaged?)",
           name, format, w, h, kMaxImagePixels);
}

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name, const DecodeOptions& opts) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegErrorManager err;
  if (jpeg_create_decompress_phase(&cinfo, &err) != 0) jpeg_fail(name, "create", err);
  JpegDecompressGuard guard{&cinfo};
  if (jpeg_header_phase(&cinfo, &err, bytes.data(), static_cast<unsigned long>(bytes.size()),
                        static_cast<long>(opts.min_side)) != 0)
    jpeg_fail(name, "header", err);
  const int64_t h = cinfo.output_height, w = cinfo.output_width, comps = cinfo.out_color_components;
  HT_CHECK(comps == 1 || comps == 3 || comps == 4, "{}: unsupported JPEG with {} colour components", name, comps);
  check_image_size(w, h, name, "JPEG");
  std::vector<uint8_t> raw(static_cast<std::size_t>(h * w * comps));
  if (jpeg_decompress_phase(&cinfo, &err, raw.data(), static_cast<std::size_t>(w * comps)) != 0)
    jpeg_fail(name, "data", err);

  Image img;
  img.height = h;
  img.width = w;
  img.channels = 3;
  img.layout = ImageLayout::hwc;
  if (comps == 3) {
    img.pixels = std::move(raw);
    return img;
  }
  img.pixels.resize(static_cast<std::size_t>(h * w * 3));
  uint8_t* o = img.pixels.data();
  const int64_t n = h * w;
  if (comps == 1) {
    for (int64_t i = 0; i < n; ++i) o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = raw[static_cast<std::size_t>(i)];
  } else {
    // CMYK (YCCK was converted to CMYK by libjpeg). Adobe-marked files store inverted values (255 = no ink).
    const bool inverted = cinfo.saw_Adobe_marker;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = &raw[static_cast<std::size_t>(4 * i)];
      const unsigned c = inverted ? p[0] : 255u - p[0], m = inverted ? p[1] : 255u - p[1];
      const unsigned y = inverted ? p[2] : 255u - p[2], k = inverted ? p[3] : 255u - p[3];
      o[3 * i] = mul255(c, k);
      o[3 * i + 1] = mul255(m, k);
      o[3 * i + 2] = mul255(y, k);
    }
  }
  return img;
}

// ---- encoder ----

int jpeg_encode_phase(jpeg_compress_struct* cinfo, JpegErrorManager* err, unsigned char** out,
                      unsigned long* out_size, const unsigned char* pixels, int height, int width, int comps,
                      J_COLOR_SPACE in_space, J_COLOR_SPACE jpeg_space, int adobe_marker, int quality) {
  install_error_manager(reinterpret_cast<jpeg_common_struct*>(cinfo), err);
  if (setjmp(err->jump)) return 1;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, out, out_size);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  cinfo->input_components = comps;
  cinfo->in_color_space = in_space;
  jpeg_set_defaults(cinfo);
  jpeg_set_colorspace(cinfo, jpeg_space);
  cinfo->write_Adobe_marker = adobe_marker ? TRUE : FALSE;
  jpeg_set_quality(cinfo, quality, TRUE);
  jpeg_start_compress(cinfo, TRUE);
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW row = const_cast<unsigned char*>(pixels) + static_cast<std::size_t>(cinfo->next_scanline) * width * comps;
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return 0;
}

#if defined(HADATRAIN_HAVE_PNG)
// Note [PNG as PIL decodes it]
// torchvision's ImageFolder loads a file with Pillow's Image.open(f).convert("RGB"), so the pixels our PNG
// decoder returns are the ones Pillow gives (test_golden_png checks every colour type and bit depth):
// - no colour management: a gAMA chunk (and sRGB, cHRM, iCCP) changes nothing;
// - 16-bit samples keep their high byte (v >> 8, not the rounded v / 257);
// - palette images are looked up in the palette; grey of 1, 2 or 4 bits is scaled to 0..255 by repeating its
//   bits (a 2-bit 1 becomes 85); grey is replicated into R, G and B;
// - alpha, and tRNS transparency, are dropped without compositing onto any background.
// One exception: Pillow opens 16-bit grey as 32-bit integers and converts them to RGB by clamping to 255, so
// every sample above 255 becomes white. We keep the high byte there too, as for every other 16-bit PNG.
// libpng's simplified API (png_image_*) cannot decode this way: it converts 16-bit data as linear light to
// sRGB and corrects gAMA. The low-level API does only the transformations asked for: expand palettes and
// low-bit grey, strip 16-bit samples to their high byte (png_set_strip_16; png_set_scale_16 would round),
// and nothing for gamma.

// Note [libpng errors]
// libpng reports a fatal error through its error callback, which must not return: ours records the message and
// png_longjmp()s to the setjmp() of the phase being run, as for libjpeg (Note [libjpeg errors]): every libpng
// call happens inside one of the C-style png_*_phase functions, which hold no objects with destructors, call
// setjmp first and return a status. libpng's warnings (a questionable colour profile, which matters nowhere
// here since no colour management is done) are ignored. A chunk with a bad CRC is an error, ancillary chunks too
// (Note [PNG chunk CRCs]).

// Note [PNG chunk CRCs]
// A chunk whose CRC does not match its bytes was damaged after it was written. libpng by default stops only for
// critical chunks (IHDR, PLTE, IDAT, IEND) and warns and skips an ancillary one (tEXt, gAMA, a private chunk);
// Pillow, whose pixels we match, raises "broken PNG file" for a bad CRC on any chunk before the image data
// (ancillary ones too, unless ImageFile.LOAD_TRUNCATED_IMAGES is set). So ancillary chunks are checked as critical
// ones are (png_set_crc_action), and the error names the file and the chunk ("x.png: cannot decode PNG: tEXt: CRC
// error"): a data set with a damaged file fails loudly instead of training on it. One difference remains, on the
// strict side: Pillow does not check the CRCs of the IDAT chunks themselves (it inflates their data as it comes),
// and libpng does, so a file whose IDAT CRC alone is wrong is an error here and opens in Pillow. Chunks after the
// image data are read by neither.
struct PngErrorManager {
  char message[256];
};

struct PngSource {
  const unsigned char* data;
  std::size_t size;
  std::size_t pos;
};

extern "C" void png_error_longjmp(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngErrorManager*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof err->message, "%s", msg);
  png_longjmp(png, 1);
}

extern "C" void png_warning_quiet(png_structp, png_const_charp) {}

extern "C" void png_read_from_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the file is truncated");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

struct PngHeader {
  png_uint_32 width = 0, height = 0;
  int channels = 0;          // after the transformations: 1 grey, 2 grey + alpha, 3 RGB, 4 RGBA
  std::size_t row_bytes = 0;  // after the transformations
};

// ---- C-style phases (Note [libpng errors]): no C++ objects with destructors inside. ----

int png_create_phase(png_structp* png, png_infop* info, PngErrorManager* err) {
  *png = png_create_read_struct(PNG_LIBPNG_VER_STRING, err, png_error_longjmp, png_warning_quiet);
  if (*png == nullptr) return 1;
  if (setjmp(png_jmpbuf(*png))) return 1;
  *info = png_create_info_struct(*png);
  return *info == nullptr ? 1 : 0;
}

// Reads the header: the image's size (h->width, h->height) with no transformation set yet.
int png_header_phase(png_structp png, png_infop info, PngSource* src, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_set_read_fn(png, src, png_read_from_memory);
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);  // Note [PNG chunk CRCs]
  png_read_info(png, info);
  h->width = png_get_image_width(png, info);
  h->height = png_get_image_height(png, info);
  return 0;
}

// Sets Note [PNG as PIL decodes it]'s transformations and reports the rows they give.
int png_transform_phase(png_structp png, png_infop info, PngHeader* h) {
  if (setjmp(png_jmpbuf(png))) return 1;
  const int colour = png_get_color_type(png, info);
  if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colour == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  h->channels = png_get_channels(png, info);
  h->row_bytes = png_get_rowbytes(png, info);
  return png_get_bit_depth(png, info) == 8 ? 0 : 2;
}

int png_rows_phase(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_read_image(png, rows);
  return 0;
}

struct PngReadGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReadGuard() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

Image decode_png(std::span<const uint8_t> bytes, const std::string& name) {
  PngErrorManager err{};
  std::snprintf(err.message, sizeof err.message, "%s", "out of memory");
  PngReadGuard guard;
  if (png_create_phase(&guard.png, &guard.info, &err) != 0) HT_FAIL("{}: cannot decode PNG: {}", name, err.message);
  PngSource src{bytes.data(), bytes.size(), 0};
  PngHeader h;
  if (png_header_phase(guard.png, guard.info, &src, &h) != 0) HT_FAIL("{}: cannot decode PNG: {}", name, err.message);
  check_image_size(h.width, h.height, name, "PNG");
  const int rc = png_transform_phase(guard.png, guard.info, &h);
  if (rc == 1) HT_FAIL("{}: cannot decode PNG: {}", name, err.message);
  HT_ASSERT(rc == 0 && h.channels >= 1 && h.channels <= 4 && h.row_bytes == std::size_t{h.width} * h.channels,
            "{}: libpng's transformations gave {} channel(s) and {} bytes per row of {} pixels", name, h.channels,
            h.row_bytes, h.width);
  std::vector<uint8_t> raw(h.row_bytes * h.height);  // (H, W, channels)
  std::vector<png_bytep> rows(h.height);
  for (std::size_t y = 0; y < rows.size(); ++y) rows[y] = raw.data() + y * h.row_bytes;
  if (png_rows_phase(guard.png, rows.data()) != 0) HT_FAIL("{}: cannot decode PNG: {}", name, err.message);

  Image img = Image::zeros(h.height, h.width, 3, ImageLayout::hwc);
  const int64_t n = img.height * img.width;
  const int k = h.channels;
  const bool grey = k <= 2;  // grey, grey + alpha
  for (int64_t i = 0; i < n; ++i)
    for (int c = 0; c < 3; ++c)
      img.pixels[static_cast<std::size_t>(3 * i + c)] = raw[static_cast<std::size_t>(k * i + (grey ? 0 : c))];
  return img;
}
#endif

}  // namespace

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::jpeg;
  static constexpr uint8_t kPng[8] = {0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() >= 8 && std::equal(kPng, kPng + 8, b.begin())) return ImageFormat::png;
  return ImageFormat::unknown;
}

bool png_decoding_available() {
#if defined(HADATRAIN_HAVE_PNG)
  return true;
#else
  return false;
#endif
}

Image decode_image(std::span<const uint8_t> bytes, const std::string& name, const DecodeOptions& opts) {
  HT_CHECK(!bytes.empty(), "{}: the file is empty", name);
  switch (sniff_image_format(bytes)) {
    case ImageFormat::jpeg: return decode_jpeg(bytes, name, opts);
    case ImageFormat::png:
#if defined(HADATRAIN_HAVE_PNG)
      return decode_png(bytes, name);
#else
      HT_FAIL("{}: this file is a PNG (signature 89 50 4E 47), whatever its name says; this hadatrain was built "
              "without libpng, so it cannot decode PNG files. Convert the file to JPEG (ImageNet's "
              "n02105855_2933.JPEG is such a file) or install libpng-dev and rebuild.",
              name);
#endif
    case ImageFormat::unknown: break;
  }
  const std::size_t k = std::min<std::size_t>(bytes.size(), 4);
  std::string head;
  for (std::size_t i = 0; i < k; ++i) head += fmt::format("{}{:02X}", i ? " " : "", bytes[i]);
  HT_FAIL("{}: not a JPEG (FF D8 FF) or PNG (89 50 4E 47) file: it starts with {}", name, head);
}

std::vector<uint8_t> read_file_bytes(const std::filesystem::path& file) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  HT_CHECK(f != nullptr, "cannot open {}: {}", file.string(), std::strerror(errno));
  std::vector<uint8_t> bytes;
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  bytes.resize(ec ? 0 : static_cast<std::size_t>(size));
  std::size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  bool failed = got < bytes.size() && std::ferror(f) != 0;
  bytes.resize(got);
  // Files whose size the filesystem does not report (pipes, /proc) or that grew meanwhile: read the rest.
  uint8_t buf[1 << 14];
  while (!failed && std::feof(f) == 0) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    bytes.insert(bytes.end(), buf, buf + n);
    failed = n < sizeof buf && std::ferror(f) != 0;
    if (n < sizeof buf) break;
  }
  std::fclose(f);
  HT_CHECK(!failed, "cannot read {}: read error", file.string());
  return bytes;
}

Image read_image(const std::filesystem::path& file, const DecodeOptions& opts) {
  const auto bytes = read_file_bytes(file);
  return decode_image(bytes, file.string(), opts);
}

std::vector<uint8_t> encode_jpeg(const Image& img_in, const JpegEncodeOptions& opts) {
  HT_CHECK(img_in.numel() > 0, "encode_jpeg: empty image {}", img_in.describe());
  HT_CHECK(opts.quality >= 1 && opts.quality <= 100, "encode_jpeg: quality must be in [1, 100], got {}", opts.quality);
  int comps = 3;
  J_COLOR_SPACE in_space = JCS_RGB, jpeg_space = JCS_YCbCr;
  bool adobe = false, invert = false;
  switch (opts.color) {
    case JpegColor::rgb: break;
    case JpegColor::gray: comps = 1, in_space = jpeg_space = JCS_GRAYSCALE; break;
    case JpegColor::cmyk: comps = 4, in_space = jpeg_space = JCS_CMYK; break;
    case JpegColor::cmyk_adobe: comps = 4, in_space = jpeg_space = JCS_CMYK, adobe = invert = true; break;
    case JpegColor::ycck_adobe: comps = 4, in_space = JCS_CMYK, jpeg_space = JCS_YCCK, adobe = invert = true; break;
  }
  HT_CHECK(img_in.channels == comps, "encode_jpeg: this colour mode needs {} channels, the image is {}", comps,
           img_in.describe());
  Image img = to_layout(img_in, ImageLayout::hwc);
  if (invert)
    for (auto& p : img.pixels) p = static_cast<uint8_t>(255 - p);

  jpeg_compress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegErrorManager err;
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  const int rc = jpeg_encode_phase(&cinfo, &err, &out, &out_size, img.pixels.data(), static_cast<int>(img.height),
                                   static_cast<int>(img.width), comps, in_space, jpeg_space, adobe ? 1 : 0,
                                   opts.quality);
  std::vector<uint8_t> bytes;
  if (rc == 0) bytes.assign(out, out + out_size);
  jpeg_destroy_compress(&cinfo);
  std::free(out);
  HT_CHECK(rc == 0, "encode_jpeg: libjpeg failed: {}", err.message);
  return bytes;
}

}  // namespace ht::data
