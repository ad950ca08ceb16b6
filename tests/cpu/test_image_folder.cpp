// Image folders and decoding: JPEGs made by the test with libjpeg's compressor (RGB, grayscale, CMYK with and
// without an Adobe marker, YCCK), PNGs written byte by byte (a PNG named .JPEG; the pixel rules PIL follows for
// 16-bit, gAMA, alpha, grey and palette files), truncated and corrupt files, class/file order, symbolic links
// (followed; a loop is an error), list files.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "hadatrain/data/image_folder.h"
#include "hadatrain/data/loader.h"
#include "support/catch.h"
#include "support/testing.h"

using namespace ht;
using namespace ht::data;
namespace fs = std::filesystem;

using ht::test::TempDir;

namespace {

void write_file(const fs::path& file, const std::vector<uint8_t>& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A 16x16 image of four flat 8x8 quadrants (JPEG blocks and 2x2 chroma subsampling stay inside a quadrant).
struct Quadrants {
  std::array<std::array<uint8_t, 4>, 4> colour;  // quadrant (top-left, top-right, bottom-left, bottom-right)
  Image image(int channels) const {
    Image img = Image::zeros(16, 16, channels, ImageLayout::hwc);
    for (int y = 0; y < 16; ++y)
      for (int x = 0; x < 16; ++x)
        for (int c = 0; c < channels; ++c)
          img.at(c, y, x) = colour[static_cast<std::size_t>((y / 8) * 2 + x / 8)][static_cast<std::size_t>(c)];
    return img;
  }
};

// |decoded - expected| at the centre 4x4 of each quadrant, worst case.
int worst_error(const Image& img, const std::array<std::array<int, 3>, 4>& expected) {
  int worst = 0;
  for (int q = 0; q < 4; ++q)
    for (int y = 2; y < 6; ++y)
      for (int x = 2; x < 6; ++x)
        for (int c = 0; c < 3; ++c)
          worst = std::max(worst, std::abs(img.at(c, (q / 2) * 8 + y, (q % 2) * 8 + x) -
                                           expected[static_cast<std::size_t>(q)][static_cast<std::size_t>(c)]));
  return worst;
}

// ---- a minimal PNG writer (stored deflate blocks), independent of libpng ----
uint32_t crc32(const uint8_t* p, std::size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}
void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}
void chunk(std::vector<uint8_t>& png, const char* type, const std::vector<uint8_t>& data) {
  put32(png, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  png.insert(png.end(), body.begin(), body.end());
  put32(png, crc32(body.data(), body.size()));
}
// A PNG of `rows` (each row's samples already packed as the PNG stores them, without the filter byte) with
// the given bit depth and colour type, and `extra` chunks (name, data) between IHDR and IDAT.
std::vector<uint8_t> make_png(uint32_t width, const std::vector<std::vector<uint8_t>>& rows, int bit_depth,
                              int colour_type, const std::vector<std::pair<std::string, std::vector<uint8_t>>>& extra = {}) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  std::vector<uint8_t> ihdr;
  put32(ihdr, width);
  put32(ihdr, static_cast<uint32_t>(rows.size()));
  // bit depth, colour type, deflate, no filter, no interlace
  ihdr.insert(ihdr.end(), {static_cast<uint8_t>(bit_depth), static_cast<uint8_t>(colour_type), 0, 0, 0});
  chunk(png, "IHDR", ihdr);
  for (const auto& [name, data] : extra) chunk(png, name.c_str(), data);
  std::vector<uint8_t> raw;
  for (const auto& row : rows) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), row.begin(), row.end());
  }
  std::vector<uint8_t> z = {0x78, 0x01, 0x01};  // zlib header, final stored block
  const auto n = static_cast<uint16_t>(raw.size());
  z.insert(z.end(), {static_cast<uint8_t>(n), static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(~n),
                     static_cast<uint8_t>(static_cast<uint16_t>(~n) >> 8)});
  z.insert(z.end(), raw.begin(), raw.end());
  uint32_t a = 1, b = 0;
  for (uint8_t byte : raw) a = (a + byte) % 65521, b = (b + a) % 65521;
  put32(z, (b << 16) | a);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", {});
  return png;
}

// An 8-bit RGB PNG of an image.
std::vector<uint8_t> make_png(const Image& rgb) {
  std::vector<std::vector<uint8_t>> rows(static_cast<std::size_t>(rgb.height));
  for (int64_t y = 0; y < rgb.height; ++y)
    for (int64_t x = 0; x < rgb.width; ++x)
      for (int c = 0; c < 3; ++c) rows[static_cast<std::size_t>(y)].push_back(rgb.at(c, y, x));
  return make_png(static_cast<uint32_t>(rgb.width), rows, 8, 2);
}

// 16-bit samples, big-endian as PNG stores them.
std::vector<uint8_t> be16(std::initializer_list<unsigned> samples) {
  std::vector<uint8_t> out;
  for (unsigned v : samples) out.insert(out.end(), {static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)});
  return out;
}

// The decoded image's pixels, (H, W, 3) flattened.
std::vector<int> decoded(const std::vector<uint8_t>& png, const std::string& name) {
  const Image img = decode_image(png, name);
  REQUIRE(img.channels == 3);
  return {img.pixels.begin(), img.pixels.end()};
}

const Quadrants kColours{{{{200, 30, 40, 0}, {20, 180, 60, 0}, {50, 60, 220, 0}, {240, 240, 240, 0}}}};
const std::array<std::array<int, 3>, 4> kExpectedRgb{{{200, 30, 40}, {20, 180, 60}, {50, 60, 220}, {240, 240, 240}}};

}  // namespace

TEST_CASE("format sniffing looks at the bytes, not the name", "[data][image]") {
  const std::vector<uint8_t> jpg = {0xFF, 0xD8, 0xFF, 0xE0}, png = {0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A};
  CHECK(sniff_image_format(jpg) == ImageFormat::jpeg);
  CHECK(sniff_image_format(png) == ImageFormat::png);
  CHECK(sniff_image_format(std::vector<uint8_t>{0x47, 0x49, 0x46}) == ImageFormat::unknown);
  CHECK(has_image_extension("a/b.JPEG"));
  CHECK(has_image_extension("b.Jpg"));
  CHECK(has_image_extension("b.PNG"));
  CHECK_FALSE(has_image_extension("b.txt"));
  CHECK_FALSE(has_image_extension("jpeg"));
}

TEST_CASE("JPEG decoding: RGB, grayscale, CMYK (plain and Adobe-inverted) and YCCK become RGB", "[data][image]") {
  // RGB.
  const Image rgb = decode_image(encode_jpeg(kColours.image(3), {95, JpegColor::rgb}), "rgb.jpg");
  REQUIRE(rgb.height == 16);
  REQUIRE(rgb.width == 16);
  REQUIRE(rgb.channels == 3);
  CHECK(rgb.layout == ImageLayout::hwc);
  CHECK(worst_error(rgb, kExpectedRgb) <= 6);

  // Grayscale: replicated into three equal channels.
  const Quadrants grey{{{{10, 0, 0, 0}, {90, 0, 0, 0}, {170, 0, 0, 0}, {250, 0, 0, 0}}}};
  const Image g = decode_image(encode_jpeg(grey.image(1), {95, JpegColor::gray}), "grey.jpg");
  REQUIRE(g.channels == 3);
  CHECK(worst_error(g, {{{10, 10, 10}, {90, 90, 90}, {170, 170, 170}, {250, 250, 250}}}) <= 3);
  for (int64_t i = 0; i < 16 * 16; ++i) {
    CHECK(g.pixels[static_cast<std::size_t>(3 * i)] == g.pixels[static_cast<std::size_t>(3 * i + 1)]);
    CHECK(g.pixels[static_cast<std::size_t>(3 * i)] == g.pixels[static_cast<std::size_t>(3 * i + 2)]);
  }

  // CMYK: R = (255 - C)(255 - K) / 255, G from M, B from Y.
  const Quadrants cmyk{{{{0, 255, 255, 0}, {255, 0, 255, 0}, {0, 0, 0, 128}, {60, 120, 180, 40}}}};
  std::array<std::array<int, 3>, 4> expected{};
  for (int q = 0; q < 4; ++q)
    for (int c = 0; c < 3; ++c) {
      const auto& k = cmyk.colour[static_cast<std::size_t>(q)];
      expected[static_cast<std::size_t>(q)][static_cast<std::size_t>(c)] =
          static_cast<int>(std::lround((255.0 - k[static_cast<std::size_t>(c)]) * (255.0 - k[3]) / 255.0));
    }
  CHECK(expected[2] == std::array<int, 3>{127, 127, 127});
  for (JpegColor mode : {JpegColor::cmyk, JpegColor::cmyk_adobe, JpegColor::ycck_adobe}) {
    const auto bytes = encode_jpeg(cmyk.image(4), {95, mode});
    const Image img = decode_image(bytes, "cmyk.jpg");
    REQUIRE(img.channels == 3);
    INFO("mode " << static_cast<int>(mode));
    CHECK(worst_error(img, expected) <= 6);
  }
}

TEST_CASE("PNG files: decoded with libpng when built with it, else a clear error", "[data][image]") {
  TempDir tmp("png");
  const Image src = kColours.image(3);
  const fs::path fake = tmp.path / "n02105855_2933.JPEG";  // a PNG with a JPEG name, as in ImageNet
  write_file(fake, make_png(src));
  if (png_decoding_available()) {
    const Image img = read_image(fake);
    CHECK(img.pixels == src.pixels);  // lossless
  } else {
    CHECK_THROWS_WITH(read_image(fake), HasSubstr(fake.string()) && HasSubstr("is a PNG") && HasSubstr("without libpng"));
  }
  // A PNG signature followed by garbage fails either way, naming the file.
  std::vector<uint8_t> broken = make_png(src);
  broken.resize(40);
  write_file(tmp.path / "broken.JPEG", broken);
  CHECK_THROWS_WITH(read_image(tmp.path / "broken.JPEG"), HasSubstr("broken.JPEG") && HasSubstr("PNG"));
  if (!png_decoding_available()) return;
  // Truncated inside the image data.
  std::vector<uint8_t> cut = make_png(src);
  cut.resize(cut.size() - 40);
  CHECK_THROWS_WITH(decode_image(cut, "cut.png"), HasSubstr("cut.png: cannot decode PNG: the file is truncated"));
  // A header announcing 60000 x 60000 pixels (IHDR's width and height patched, its CRC recomputed): refused
  // before a buffer is allocated.
  std::vector<uint8_t> huge = make_png(src);
  for (std::size_t i : {16, 20}) std::copy_n(std::array<uint8_t, 4>{0, 0, 0xEA, 0x60}.begin(), 4, huge.begin() + static_cast<long>(i));
  const uint32_t crc = crc32(huge.data() + 12, 17);  // "IHDR" + its 13 bytes
  for (int k = 0; k < 4; ++k) huge[static_cast<std::size_t>(29 + k)] = static_cast<uint8_t>(crc >> (24 - 8 * k));
  CHECK_THROWS_WITH(decode_image(huge, "huge.png"),
                    HasSubstr("huge.png: the PNG header gives 60000 x 60000 pixels; hadatrain decodes images of at most"));
  // A corrupt file leaves no state behind: the good file decodes afterwards.
  CHECK(decode_image(make_png(src), "good.png").pixels == src.pixels);
}

namespace {
// `png` with the CRC of its first `type` chunk made wrong (its last byte flipped).
std::vector<uint8_t> with_bad_crc(std::vector<uint8_t> png, const char* type) {
  for (std::size_t at = 8; at + 12 <= png.size();) {
    const uint32_t length = (uint32_t{png[at]} << 24) | (uint32_t{png[at + 1]} << 16) | (uint32_t{png[at + 2]} << 8) |
                            png[at + 3];
    if (std::equal(type, type + 4, png.begin() + static_cast<long>(at + 4))) {
      png[at + 8 + length + 3] ^= 0xFF;
      return png;
    }
    at += 12 + length;
  }
  FAIL("no " << type << " chunk");
  return png;
}
}  // namespace

TEST_CASE("a PNG chunk with a bad CRC is an error naming the file and the chunk, ancillary or critical",
          "[data][image]") {
  if (!png_decoding_available()) return;
  // Pillow refuses a bad CRC on any chunk it reads before the image data, ancillary ones too (a tEXt note, a gAMA, a
  // private chunk): so does the loader, where a corrupt file passing would be silent damage to the data set.
  const std::pair<std::string, std::vector<uint8_t>> text{"tEXt", {'k', 0, 'v'}};
  const std::pair<std::string, std::vector<uint8_t>> gama{"gAMA", {0x00, 0x01, 0x86, 0xA0}};
  const std::pair<std::string, std::vector<uint8_t>> priv{"prVt", {1, 2, 3}};
  const std::pair<std::string, std::vector<uint8_t>> plte{"PLTE", {1, 2, 3, 40, 50, 60}};
  const std::vector<uint8_t> rgb = make_png(1, {{128, 64, 200}}, 8, 2, {text, gama, priv});
  REQUIRE(decoded(rgb, "good.png") == std::vector<int>{128, 64, 200});  // the fixture is sound
  for (const char* type : {"tEXt", "gAMA", "prVt", "IHDR", "IDAT"}) {
    INFO(type);
    CHECK_THROWS_WITH(decode_image(with_bad_crc(rgb, type), "bad.png"),
                      HasSubstr(fmt::format("bad.png: cannot decode PNG: {}: CRC error", type)));
  }
  CHECK_THROWS_WITH(decode_image(with_bad_crc(make_png(2, {{1, 0}}, 8, 3, {plte}), "PLTE"), "pal.png"),
                    HasSubstr("pal.png: cannot decode PNG: PLTE: CRC error"));
  // Read from a file, the error names its path.
  TempDir tmp("png_crc");
  write_file(tmp.path / "n01.png", with_bad_crc(rgb, "tEXt"));
  CHECK_THROWS_WITH(read_image(tmp.path / "n01.png"),
                    HasSubstr((tmp.path / "n01.png").string()) && HasSubstr("tEXt: CRC error"));
}

TEST_CASE("PNG pixels as PIL decodes them: 16-bit high byte, no gamma, alpha dropped, grey and palettes expanded",
          "[data][image]") {
  if (!png_decoding_available()) return;  // the test above checks the error a build without libpng gives
  const std::pair<std::string, std::vector<uint8_t>> linear{"gAMA", {0x00, 0x01, 0x86, 0xA0}};  // gamma 1.0
  // 16-bit RGB: the high byte of each sample (0x10F0 -> 0x10, where round(v / 257) is 0x11).
  CHECK(decoded(make_png(2, {be16({0x10F0, 0x80FF, 0xFFFF, 0x0000, 0x00FF, 0x7F80})}, 16, 2), "rgb16") ==
        std::vector<int>{0x10, 0x80, 0xFF, 0x00, 0x00, 0x7F});
  // ... also with a gAMA chunk, and for RGBA (alpha dropped, colour kept where alpha is 0) and grey + alpha.
  CHECK(decoded(make_png(1, {be16({0x10F0, 0x2345, 0xABCD})}, 16, 2, {linear}), "rgb16_gama") ==
        std::vector<int>{0x10, 0x23, 0xAB});
  CHECK(decoded(make_png(1, {be16({0x10F0, 0x2345, 0xABCD, 0x0000})}, 16, 6), "rgba16") ==
        std::vector<int>{0x10, 0x23, 0xAB});
  CHECK(decoded(make_png(1, {be16({0xC0FF, 0x0100})}, 16, 4), "ga16") == std::vector<int>{0xC0, 0xC0, 0xC0});
  // 16-bit grey: the high byte too (Pillow alone clamps the value to 255 there: Note [PNG as PIL decodes it]).
  CHECK(decoded(make_png(2, {be16({0x1234, 0x00FF})}, 16, 0), "grey16") == std::vector<int>{0x12, 0x12, 0x12, 0, 0, 0});
  // A gAMA chunk other than sRGB's changes nothing (8-bit RGB, RGBA with alpha 0, grey).
  CHECK(decoded(make_png(1, {{128, 64, 200}}, 8, 2, {linear}), "rgb8_gama") == std::vector<int>{128, 64, 200});
  CHECK(decoded(make_png(1, {{10, 20, 30, 0}}, 8, 6, {linear}), "rgba8_gama") == std::vector<int>{10, 20, 30});
  CHECK(decoded(make_png(1, {{100}}, 8, 0, {linear}), "grey8_gama") == std::vector<int>{100, 100, 100});
  // Grey of 1, 2 and 4 bits scaled to 0..255 (repeated bits); a row of 3 samples ends inside its byte.
  CHECK(decoded(make_png(3, {{0b10100000}}, 1, 0), "grey1") == std::vector<int>{255, 255, 255, 0, 0, 0, 255, 255, 255});
  CHECK(decoded(make_png(3, {{0b01101100}}, 2, 0), "grey2") == std::vector<int>{85, 85, 85, 170, 170, 170, 255, 255, 255});
  CHECK(decoded(make_png(2, {{0x5F}}, 4, 0), "grey4") == std::vector<int>{85, 85, 85, 255, 255, 255});
  // Grey + alpha, 8 bits.
  CHECK(decoded(make_png(1, {{77, 0}}, 8, 4), "ga8") == std::vector<int>{77, 77, 77});
  // Palettes of 2 and 8 bits, with tRNS (dropped) and gAMA (ignored).
  const std::pair<std::string, std::vector<uint8_t>> plte{"PLTE", {1, 2, 3, 40, 50, 60, 200, 100, 0, 9, 8, 7}};
  const std::pair<std::string, std::vector<uint8_t>> trns{"tRNS", {0, 128}};
  CHECK(decoded(make_png(3, {{0b11100100}}, 2, 3, {linear, plte, trns}), "pal2") ==
        std::vector<int>{9, 8, 7, 200, 100, 0, 40, 50, 60});
  CHECK(decoded(make_png(2, {{1, 0}}, 8, 3, {plte, trns}), "pal8") == std::vector<int>{40, 50, 60, 1, 2, 3});
}

TEST_CASE("truncated, corrupt, empty and foreign files give errors naming the file", "[data][image]") {
  TempDir tmp("bad");
  const auto good = encode_jpeg(Image::zeros(64, 48, 3, ImageLayout::hwc), {90, JpegColor::rgb});
  // Truncated in the entropy-coded data (libjpeg would pad with grey and only warn).
  write_file(tmp.path / "trunc.JPEG", std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() * 2 / 3)));
  CHECK_THROWS_WITH(read_image(tmp.path / "trunc.JPEG"), HasSubstr("trunc.JPEG") && (HasSubstr("truncated") || HasSubstr("cannot decode JPEG")));
  // Truncated inside the header.
  write_file(tmp.path / "head.jpg", std::vector<uint8_t>(good.begin(), good.begin() + 30));
  CHECK_THROWS_WITH(read_image(tmp.path / "head.jpg"), HasSubstr("head.jpg") && HasSubstr("cannot decode JPEG"));
  // A JPEG signature followed by garbage.
  std::vector<uint8_t> garbage = {0xFF, 0xD8, 0xFF, 0x01};
  garbage.resize(200, 0x5A);
  write_file(tmp.path / "garbage.jpg", garbage);
  CHECK_THROWS_WITH(read_image(tmp.path / "garbage.jpg"), HasSubstr("garbage.jpg") && HasSubstr("cannot decode JPEG"));
  write_file(tmp.path / "empty.jpg", {});
  CHECK_THROWS_WITH(read_image(tmp.path / "empty.jpg"), HasSubstr("empty.jpg") && HasSubstr("empty"));
  write_file(tmp.path / "gif.jpg", {'G', 'I', 'F', '8', '9', 'a'});
  CHECK_THROWS_WITH(read_image(tmp.path / "gif.jpg"), HasSubstr("gif.jpg") && HasSubstr("47 49 46 38"));
  CHECK_THROWS_WITH(read_image(tmp.path / "missing.jpg"), HasSubstr("missing.jpg"));
  // A header announcing 60000 x 60000 pixels (SOF0's height and width patched): refused before the decoder
  // allocates the 10.8 GB its buffer would need.
  std::vector<uint8_t> huge = good;
  for (std::size_t i = 0; i + 8 < huge.size(); ++i)
    if (huge[i] == 0xFF && huge[i + 1] == 0xC0) {  // SOF0: FF C0, length (2), precision (1), height (2), width (2)
      huge[i + 5] = huge[i + 7] = 0xEA;
      huge[i + 6] = huge[i + 8] = 0x60;
      break;
    }
  CHECK_THROWS_WITH(decode_image(huge, "huge.jpg"),
                    HasSubstr("huge.jpg: the JPEG header gives 60000 x 60000 pixels; hadatrain decodes images of at most"));
  // The good file still decodes after all those failures (no state leaks between decodes).
  CHECK(decode_image(good, "good").height == 64);
}

TEST_CASE("libjpeg DCT scaling keeps both sides >= min_side", "[data][image]") {
  const auto bytes = encode_jpeg(Image::zeros(64, 48, 3, ImageLayout::hwc), {90, JpegColor::rgb});
  const Image full = decode_image(bytes, "x");
  CHECK(full.height == 64);
  CHECK(full.width == 48);
  const Image quarter = decode_image(bytes, "x", {12});  // 1/4: 16x12
  CHECK(quarter.height == 16);
  CHECK(quarter.width == 12);
  const Image half = decode_image(bytes, "x", {13});  // 1/4 would give width 12 < 13: 1/2
  CHECK(half.height == 32);
  CHECK(half.width == 24);
  CHECK(decode_image(bytes, "x", {100}).height == 64);  // never upscales
}

TEST_CASE("an image folder: sorted classes, torchvision file order, labels, decoding", "[data][image]") {
  TempDir tmp("folder");
  const fs::path root = tmp.path / "train";
  auto jpeg = [](uint8_t v) { return encode_jpeg(Image::zeros(8, 8, 3, ImageLayout::hwc), {90, JpegColor::rgb}); };
  // Class folders in byte order: "Zebra" < "n01" < "n02" (upper case sorts first).
  for (const char* name : {"n02/b.jpg", "n02/a.JPEG", "n02/A.jpeg", "n02/sub/c.jpeg", "n02/sub2/0.PNG.jpg",
                           "n01/x.Jpg", "Zebra/z.jpeg"})
    write_file(root / name, jpeg(0));
  write_file(root / "n02/notes.txt", {'h', 'i'});
  write_file(root / "n01/readme", {'h', 'i'});
  // A grey image in n01 to check the pixels that come back.
  Image grey = Image::zeros(8, 8, 1, ImageLayout::hwc);
  std::fill(grey.pixels.begin(), grey.pixels.end(), uint8_t{77});
  write_file(root / "n01/y.jpeg", encode_jpeg(grey, {95, JpegColor::gray}));

  ImageFolder folder({root});
  CHECK(folder.classes() == std::vector<std::string>{"Zebra", "n01", "n02"});
  REQUIRE(folder.size() == 8);
  std::vector<std::string> rel;
  for (int64_t i = 0; i < folder.size(); ++i) rel.push_back(fs::relative(folder.file(i), root).generic_string());
  CHECK(rel == std::vector<std::string>{"Zebra/z.jpeg", "n01/x.Jpg", "n01/y.jpeg", "n02/A.jpeg", "n02/a.JPEG",
                                        "n02/b.jpg", "n02/sub/c.jpeg", "n02/sub2/0.PNG.jpg"});
  CHECK(folder.labels() == std::vector<int64_t>{0, 1, 1, 2, 2, 2, 2, 2});
  SampleRng rng(0, 0);
  const Sample s = folder.get(2, rng);
  CHECK(s.label == 1);
  CHECK(s.image.channels == 3);
  CHECK(s.image.height == 8);
  CHECK(std::abs(static_cast<int>(s.image.at(1, 4, 4)) - 77) <= 1);
  CHECK(folder.describe_sample(2) == (root / "n01/y.jpeg").string());
  const DecodeStats st = folder.decode_stats();
  CHECK(st.images == 1);
  CHECK(st.pixels == 64);
  CHECK(st.bytes == static_cast<int64_t>(fs::file_size(root / "n01/y.jpeg")));

  // Decode throughput over the folder's files: counts are exact (times are not tested).
  std::vector<fs::path> files;
  for (int64_t i = 0; i < folder.size(); ++i) files.push_back(folder.file(i));
  const DecodeStats m = measure_decode(files, {}, 3);
  CHECK(m.images == 8);
  CHECK(m.pixels == 8 * 64);
  CHECK_THAT(m.summary(), HasSubstr("8 images"));

  // A validation folder missing a class keeps the training indices when given the classes.
  write_file(tmp.path / "val/n02/v.jpeg", jpeg(0));
  ImageFolder val({tmp.path / "val", {}, folder.classes()});
  CHECK(val.labels() == std::vector<int64_t>{2});
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "val", {}, {"n01"}}), HasSubstr("n02 is not one of"));
  // Errors: no classes, an empty class, not a directory.
  fs::create_directories(tmp.path / "flat");
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "flat"}), HasSubstr("no class sub-folders"));
  fs::create_directories(root / "n03_empty");
  CHECK_THROWS_WITH(ImageFolder({root}), HasSubstr("n03_empty holds no"));
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "nothing"}), HasSubstr("is not a directory"));
}

TEST_CASE("a flat folder with a list file (ImageNet val as distributed)", "[data][image]") {
  TempDir tmp("list");
  const auto bytes = encode_jpeg(Image::zeros(4, 4, 3, ImageLayout::hwc), {90, JpegColor::rgb});
  for (const char* f : {"v1.JPEG", "v2.JPEG", "v3.JPEG"}) write_file(tmp.path / "val" / f, bytes);
  {
    std::ofstream list(tmp.path / "val.txt");
    list << "v1.JPEG n09\n\nv2.JPEG n01\nv3.JPEG n05\n";
  }
  ImageFolder by_name({tmp.path / "val", tmp.path / "val.txt"});
  CHECK(by_name.classes() == std::vector<std::string>{"n01", "n05", "n09"});
  CHECK(by_name.labels() == std::vector<int64_t>{2, 0, 1});
  ImageFolder with_classes({tmp.path / "val", tmp.path / "val.txt", {"n00", "n01", "n05", "n09"}});
  CHECK(with_classes.labels() == std::vector<int64_t>{3, 1, 2});
  {
    std::ofstream list(tmp.path / "idx.txt");
    list << "v1.JPEG 4\nv2.JPEG 0\n";
  }
  ImageFolder by_index({tmp.path / "val", tmp.path / "idx.txt"});
  CHECK(by_index.labels() == std::vector<int64_t>{4, 0});
  CHECK(by_index.classes().size() == 5);
  {
    std::ofstream list(tmp.path / "bad.txt");
    list << "v1.JPEG n01 extra\n";
  }
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "val", tmp.path / "bad.txt"}), HasSubstr("bad.txt:1"));
  {
    std::ofstream list(tmp.path / "mixed.txt");
    list << "v1.JPEG n01\nv2.JPEG 3\n";
  }
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "val", tmp.path / "mixed.txt"}), HasSubstr("mixes"));
  CHECK_THROWS_WITH(ImageFolder({tmp.path / "val", tmp.path / "val.txt", {"n01"}}), HasSubstr("names class n09"));
}

TEST_CASE("a corrupt file inside a folder surfaces through the loader with its path", "[data][image][loader]") {
  TempDir tmp("loaderr");
  const auto bytes = encode_jpeg(Image::zeros(8, 8, 3, ImageLayout::hwc), {90, JpegColor::rgb});
  for (int i = 0; i < 6; ++i) write_file(tmp.path / "c" / fmt::format("f{}.jpg", i), bytes);
  write_file(tmp.path / "c/f3.jpg", std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 2)));
  auto ds = std::make_shared<const ImageFolder>(ImageFolderOptions{tmp.path});
  LoaderOptions o;
  o.batch_size = 2;
  o.num_workers = 2;
  o.shuffle = Shuffle::off;
  DataLoader loader(ds, o);
  CHECK(loader.next()->indices == std::vector<int64_t>{0, 1});
  CHECK_THROWS_WITH(loader.next(), HasSubstr("batch 1") && HasSubstr("dataset index 3") && HasSubstr("f3.jpg") &&
                                       (HasSubstr("truncated") || HasSubstr("cannot decode JPEG")));
}

TEST_CASE("symbolic links: followed as torchvision does; a link loop is an error naming the link", "[data][image]") {
  TempDir tmp("links");
  const auto jpeg = encode_jpeg(Image::zeros(4, 4, 3, ImageLayout::hwc), {90, JpegColor::rgb});
  // Links to folders and files outside the root are followed; a folder reached by two links is listed twice.
  const fs::path shared = tmp.path / "shared";
  write_file(shared / "s.jpg", jpeg);
  const fs::path root = tmp.path / "root";
  write_file(root / "a/a.jpg", jpeg);
  fs::create_directory_symlink(shared, root / "a/one");
  fs::create_directory_symlink(shared, root / "a/two");
  fs::create_symlink(shared / "s.jpg", root / "a/file_link.jpg");
  fs::create_directory_symlink(shared, root / "b");  // a class folder that is a link
  {
    ImageFolder folder({root});
    CHECK(folder.classes() == std::vector<std::string>{"a", "b"});
    std::vector<std::string> rel;
    for (int64_t i = 0; i < folder.size(); ++i) rel.push_back(folder.file(i).lexically_relative(root).generic_string());
    CHECK(rel == std::vector<std::string>{"a/a.jpg", "a/file_link.jpg", "a/one/s.jpg", "a/two/s.jpg", "b/s.jpg"});
  }
  // A link to the folder that holds it.
  fs::create_directory_symlink(root / "a", root / "a/sub_loop");
  CHECK_THROWS_WITH(ImageFolder({root}),
                    HasSubstr("image folder " + root.string() + ": " + (root / "a/sub_loop").string() +
                              " is a symbolic link loop: it leads to " + (root / "a").string() +
                              ", a folder the scan is already in") &&
                        HasSubstr("remove the link"));
  fs::remove(root / "a/sub_loop");
  // Two links that lead into each other's folders.
  write_file(root / "c/x/x.jpg", jpeg);
  write_file(root / "c/y/y.jpg", jpeg);
  fs::create_directory_symlink(root / "c/y", root / "c/x/to_y");
  fs::create_directory_symlink(root / "c/x", root / "c/y/to_x");
  CHECK_THROWS_WITH(ImageFolder({root}), HasSubstr(" is a symbolic link loop: it leads to " + (root / "c").string()));
  fs::remove_all(root / "c");
  // A link to itself cannot be resolved at all.
  fs::create_symlink(root / "a/self.jpg", root / "a/self.jpg");
  CHECK_THROWS_WITH(ImageFolder({root}), HasSubstr("image folder " + root.string() + ": cannot read " +
                                                   (root / "a/self.jpg").string() + ": Too many levels of symbolic links"));
  fs::remove(root / "a/self.jpg");
  // A dangling link is skipped.
  fs::create_symlink(tmp.path / "gone.jpg", root / "a/dangling.jpg");
  CHECK(ImageFolder({root}).size() == 5);
}
