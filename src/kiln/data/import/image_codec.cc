#include "kiln/data/import/image_codec.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// clang-format off
#include <jpeglib.h>  // needs <cstdio> first
#include <png.h>
// clang-format on

namespace kiln::data {
namespace {

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// ---- JPEG ----

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  bool warned = false;
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (!err->warned) (*cinfo->err->format_message)(cinfo, err->message);
  err->warned = true;  // corrupt data: made an error after decompression
}

absl::StatusOr<Image> DecodeJpeg(std::string_view bytes, const std::string& name, int min_w,
                                 int min_h) {
  Image img;
  img.format = "jpeg";
  std::vector<uint8_t> raw;  // declared before setjmp: a longjmp must not skip its destructor
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  err.mgr.emit_message = JpegEmitMessage;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return Bad(name, absl::StrCat("bad JPEG: ", err.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (static_cast<uint64_t>(cinfo.image_width) * cinfo.image_height > (uint64_t{1} << 28)) {
    jpeg_destroy_decompress(&cinfo);
    return Bad(name, absl::StrCat("JPEG of ", cinfo.image_width, "x", cinfo.image_height,
                                  " pixels is larger than the 2^28 pixels accepted"));
  }
  bool cmyk = false;
  if (min_w > 0 && min_h > 0) {
    for (unsigned d = 8; d >= 2; d /= 2) {
      if ((cinfo.image_width + d - 1) / d >= 2u * min_w &&
          (cinfo.image_height + d - 1) / d >= 2u * min_h) {
        cinfo.scale_num = 1;
        cinfo.scale_denom = d;
        img.format += absl::StrCat(" scaled 1/", d);
        break;
      }
    }
  }
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
    img.format += " gray";
  } else if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    cinfo.out_color_space = JCS_CMYK;
    cmyk = true;
    img.format += " cmyk";
  } else {
    cinfo.out_color_space = JCS_RGB;
    img.format += " rgb";
  }
  jpeg_start_decompress(&cinfo);
  const int w = static_cast<int>(cinfo.output_width), h = static_cast<int>(cinfo.output_height);
  const int in_ch = cinfo.output_components;
  raw.resize(static_cast<size_t>(w) * h * in_ch);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = raw.data() + static_cast<size_t>(cinfo.output_scanline) * w * in_ch;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (err.warned) return Bad(name, absl::StrCat("corrupt JPEG data: ", err.message));
  img.width = w;
  img.height = h;
  if (!cmyk) {
    img.channels = in_ch;
    img.pixels = std::move(raw);
    return img;
  }
  img.channels = 3;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0, n = static_cast<size_t>(w) * h; i < n; ++i) {
    const unsigned k = raw[4 * i + 3];
    for (int c = 0; c < 3; ++c)
      img.pixels[3 * i + c] = static_cast<uint8_t>((raw[4 * i + c] * k + 127) / 255);
  }
  return img;
}

// ---- PNG ----

struct PngReadState {
  std::string_view bytes;
  size_t pos = 0;
  std::string error;
};

void PngError(png_structp png, png_const_charp msg) {
  auto* st = static_cast<PngReadState*>(png_get_error_ptr(png));
  if (st != nullptr && st->error.empty()) st->error = msg;
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // e.g. "iCCP: known incorrect sRGB profile"

void PngRead(png_structp png, png_bytep out, png_size_t n) {
  auto* st = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (st->bytes.size() - st->pos < n) png_error(png, "truncated PNG (file ends early)");
  std::memcpy(out, st->bytes.data() + st->pos, n);
  st->pos += n;
}

const char* PngColorName(int color_type) {
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      return "gray";
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      return "gray+alpha";
    case PNG_COLOR_TYPE_PALETTE:
      return "palette";
    case PNG_COLOR_TYPE_RGB:
      return "rgb";
    case PNG_COLOR_TYPE_RGB_ALPHA:
      return "rgba";
  }
  return "?";
}

absl::StatusOr<Image> DecodePng(std::string_view bytes, const std::string& name) {
  PngReadState st;
  st.bytes = bytes;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &st, PngError, PngWarning);
  if (png == nullptr) return absl::ResourceExhaustedError("png_create_read_struct failed");
  png_infop info = png_create_info_struct(png);
  Image img;
  std::vector<png_bytep> rows;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return Bad(name, absl::StrCat("bad PNG: ", st.error));
  }
  png_set_read_fn(png, &st, PngRead);
  // Guards against absurd sizes in a corrupt header (libpng checks them against these).
  png_set_user_limits(png, 1 << 15, 1 << 15);
  png_read_info(png, info);
  if (static_cast<uint64_t>(png_get_image_width(png, info)) * png_get_image_height(png, info) >
      (uint64_t{1} << 28)) {
    png_error(png, "image larger than the 2^28 pixels accepted");
  }
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  img.format = absl::StrCat("png ", PngColorName(color), " ", depth, "-bit");
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (depth == 16) png_set_scale_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  img.width = static_cast<int>(png_get_image_width(png, info));
  img.height = static_cast<int>(png_get_image_height(png, info));
  img.channels = png_get_channels(png, info);
  const size_t stride = png_get_rowbytes(png, info);
  if (stride != static_cast<size_t>(img.width) * img.channels) {
    png_error(png, "unexpected row size after transformations");
  }
  img.pixels.resize(stride * img.height);
  rows.resize(img.height);
  for (int y = 0; y < img.height; ++y) rows[y] = img.pixels.data() + stride * y;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return img;
}

struct PngWriteState {
  std::string out;
  std::string error;
};

void PngWrite(png_structp png, png_bytep data, png_size_t n) {
  static_cast<PngWriteState*>(png_get_io_ptr(png))->out.append(reinterpret_cast<char*>(data), n);
}
void PngFlush(png_structp) {}
void PngWriteError(png_structp png, png_const_charp msg) {
  auto* st = static_cast<PngWriteState*>(png_get_error_ptr(png));
  if (st->error.empty()) st->error = msg;
  png_longjmp(png, 1);
}

}  // namespace

absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& name) {
  return DecodeImage(bytes, name, 0, 0);
}

absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& name, int min_width,
                                  int min_height) {
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF) {
    return DecodeJpeg(bytes, name, min_width, min_height);
  }
  if (bytes.size() >= 8 &&
      png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, 8) == 0) {
    return DecodePng(bytes, name);
  }
  return Bad(name, bytes.empty() ? "empty file" : "neither a JPEG nor a PNG (unknown signature)");
}

absl::StatusOr<std::string> EncodePng(const PngSpec& spec) {
  PngWriteState st;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &st, PngWriteError, PngWarning);
  png_infop info = png_create_info_struct(png);
  std::vector<png_bytep> rows(spec.height);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return absl::InvalidArgumentError(absl::StrCat("EncodePng: ", st.error));
  }
  png_set_write_fn(png, &st, PngWrite, PngFlush);
  png_set_IHDR(png, info, spec.width, spec.height, spec.bit_depth, spec.color_type,
               spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> pal;
  for (size_t i = 0; i + 2 < spec.palette.size(); i += 3) {
    pal.push_back({static_cast<png_byte>(spec.palette[i]),
                   static_cast<png_byte>(spec.palette[i + 1]),
                   static_cast<png_byte>(spec.palette[i + 2])});
  }
  if (!pal.empty()) png_set_PLTE(png, info, pal.data(), static_cast<int>(pal.size()));
  if (!spec.trns.empty()) {
    if (spec.color_type == PNG_COLOR_TYPE_PALETTE) {
      png_set_tRNS(png, info, reinterpret_cast<png_const_bytep>(spec.trns.data()),
                   static_cast<int>(spec.trns.size()), nullptr);
    } else {
      auto u16 = [&](size_t i) {
        return static_cast<png_uint_16>((static_cast<uint8_t>(spec.trns[2 * i]) << 8) |
                                        static_cast<uint8_t>(spec.trns[2 * i + 1]));
      };
      png_color_16 c{};
      if (spec.color_type == PNG_COLOR_TYPE_GRAY) {
        c.gray = u16(0);
      } else {
        c.red = u16(0);
        c.green = u16(1);
        c.blue = u16(2);
      }
      png_set_tRNS(png, info, nullptr, 0, &c);
    }
  }
  png_write_info(png, info);
  const size_t stride = spec.rows.size() / std::max(spec.height, 1);
  for (int y = 0; y < spec.height; ++y) {
    rows[y] = reinterpret_cast<png_bytep>(const_cast<char*>(spec.rows.data())) + stride * y;
  }
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return st.out;
}

absl::StatusOr<std::string> EncodeJpeg(const Image& image, int quality) {
  if (image.channels != 1 && image.channels != 3) {
    return absl::InvalidArgumentError("EncodeJpeg: 1 or 3 channels only");
  }
  jpeg_compress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buf);
    return absl::InvalidArgumentError(absl::StrCat("EncodeJpeg: ", err.message));
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = image.width;
  cinfo.image_height = image.height;
  cinfo.input_components = image.channels;
  cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(image.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * image.width * image.channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  std::free(buf);
  return out;
}

}  // namespace kiln::data
