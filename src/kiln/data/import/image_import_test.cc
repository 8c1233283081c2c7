#include "kiln/data/import/image_import.h"

#include <png.h>

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/import/image_codec.h"
#include "kiln/data/import/image_transform.h"
#include "kiln/data/shard_io.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

std::string Bytes(std::initializer_list<int> v) {
  std::string s;
  for (int x : v) s.push_back(static_cast<char>(x));
  return s;
}

Image Decode(const PngSpec& spec) {
  absl::StatusOr<std::string> png = EncodePng(spec);
  EXPECT_TRUE(png.ok()) << png.status();
  absl::StatusOr<Image> img = DecodeImage(*png, "t.png");
  EXPECT_TRUE(img.ok()) << img.status();
  return img.ok() ? *img : Image{};
}

std::vector<uint8_t> V(std::initializer_list<int> v) {
  return std::vector<uint8_t>(v.begin(), v.end());
}

TEST(ImageCodec, PngColorTypesAndDepthsAreHandledExplicitly) {
  // 8-bit gray, 2x1.
  Image g = Decode({2, 1, PNG_COLOR_TYPE_GRAY, 8, Bytes({10, 200})});
  EXPECT_EQ(g.channels, 1);
  EXPECT_EQ(g.pixels, V({10, 200}));
  // 1-bit gray: 1 0 1 0 -> 255 0 255 0.
  Image g1 = Decode({4, 1, PNG_COLOR_TYPE_GRAY, 1, Bytes({0xA0})});
  EXPECT_EQ(g1.pixels, V({255, 0, 255, 0}));
  // 16-bit gray scaled with rounding: 0xFFFF -> 255, 0x8080 -> 128, 0x0100 -> 1.
  Image g16 = Decode({3, 1, PNG_COLOR_TYPE_GRAY, 16, Bytes({0xFF, 0xFF, 0x80, 0x80, 0x01, 0x00})});
  EXPECT_EQ(g16.pixels, V({255, 128, 1}));
  // Gray + alpha.
  Image ga = Decode({1, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 8, Bytes({50, 128})});
  EXPECT_EQ(ga.channels, 2);
  EXPECT_EQ(ga.pixels, V({50, 128}));
  // Palette with tRNS: entry 1 is half transparent -> RGBA.
  Image p = Decode({2, 1, PNG_COLOR_TYPE_PALETTE, 8, Bytes({0, 1}), Bytes({1, 2, 3, 4, 5, 6}),
                    Bytes({255, 128})});
  EXPECT_EQ(p.channels, 4);
  EXPECT_EQ(p.pixels, V({1, 2, 3, 255, 4, 5, 6, 128}));
  // Palette without tRNS -> RGB; 16-bit RGB; interlaced RGBA.
  Image p3 = Decode({1, 1, PNG_COLOR_TYPE_PALETTE, 8, Bytes({0}), Bytes({9, 8, 7})});
  EXPECT_EQ(p3.channels, 3);
  EXPECT_EQ(p3.pixels, V({9, 8, 7}));
  Image rgb16 = Decode({1, 1, PNG_COLOR_TYPE_RGB, 16, Bytes({0xFF, 0xFF, 0, 0, 0x80, 0x80})});
  EXPECT_EQ(rgb16.pixels, V({255, 0, 128}));
  std::string rows;
  for (int i = 0; i < 8 * 8 * 4; ++i) rows.push_back(static_cast<char>(i));
  PngSpec inter{8, 8, PNG_COLOR_TYPE_RGB_ALPHA, 8, rows};
  inter.interlaced = true;
  Image ri = Decode(inter);
  EXPECT_EQ(ri.channels, 4);
  EXPECT_EQ(std::string(ri.pixels.begin(), ri.pixels.end()), rows);
}

TEST(ImageCodec, JpegRoundTripAndCorruptFilesNameTheFile) {
  Image rgb;
  rgb.width = 16;
  rgb.height = 8;
  rgb.channels = 3;
  for (int i = 0; i < 16 * 8; ++i) {
    rgb.pixels.push_back(200);
    rgb.pixels.push_back(40);
    rgb.pixels.push_back(90);
  }
  absl::StatusOr<std::string> jpg = EncodeJpeg(rgb, 95);
  ASSERT_TRUE(jpg.ok());
  absl::StatusOr<Image> back = DecodeImage(*jpg, "a.jpg");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->channels, 3);
  EXPECT_EQ(back->width, 16);
  for (size_t i = 0; i < back->pixels.size(); ++i) EXPECT_NEAR(back->pixels[i], rgb.pixels[i], 4);
  // Truncated JPEG: an error naming the file (not a gray fill).
  absl::StatusOr<Image> cut = DecodeImage(jpg->substr(0, jpg->size() / 2), "cats/cut.jpg");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("cats/cut.jpg"), std::string::npos) << cut.status();
  // Truncated PNG, corrupt PNG data, unknown signature.
  absl::StatusOr<std::string> png = EncodePng({4, 4, PNG_COLOR_TYPE_GRAY, 8, std::string(16, 'a')});
  ASSERT_TRUE(png.ok());
  absl::StatusOr<Image> tp = DecodeImage(png->substr(0, png->size() - 20), "dogs/t.png");
  ASSERT_FALSE(tp.ok());
  EXPECT_NE(tp.status().message().find("dogs/t.png: bad PNG"), std::string::npos) << tp.status();
  std::string flipped = *png;
  flipped[40] ^= 0x55;
  EXPECT_FALSE(DecodeImage(flipped, "f.png").ok());
  absl::StatusOr<Image> junk = DecodeImage("hello", "x.png");
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("neither a JPEG nor a PNG"), std::string::npos);
}

TEST(ImageCodec, BigJpegsDecodeScaledForSmallTargets) {
  Image rgb;
  rgb.width = 64;
  rgb.height = 48;
  rgb.channels = 3;
  for (int y = 0; y < 48; ++y) {
    for (int x = 0; x < 64; ++x) {
      for (int c = 0; c < 3; ++c) rgb.pixels.push_back(static_cast<uint8_t>(x * 2 + y * c));
    }
  }
  const std::string jpg = *EncodeJpeg(rgb, 95);
  absl::StatusOr<Image> full = DecodeImage(jpg, "a.jpg");
  absl::StatusOr<Image> quarter = DecodeImage(jpg, "a.jpg", 8, 6);  // 16x12 >= 2 * 8x6
  absl::StatusOr<Image> half = DecodeImage(jpg, "a.jpg", 16, 12);   // 32x24 >= 2 * 16x12
  absl::StatusOr<Image> none = DecodeImage(jpg, "a.jpg", 40, 30);
  ASSERT_TRUE(full.ok() && quarter.ok() && half.ok() && none.ok());
  EXPECT_EQ(quarter->width, 16);
  EXPECT_EQ(quarter->height, 12);
  EXPECT_EQ(half->width, 32);
  EXPECT_EQ(none->width, 64);
  // The scaled decode agrees with a full decode shrunk by area averaging.
  Image shrunk = ResizeImage(*full, 12, 16, ResizeMode::kFit);
  for (size_t i = 0; i < shrunk.pixels.size(); ++i)
    EXPECT_NEAR(shrunk.pixels[i], quarter->pixels[i], 6);
}

TEST(ImageCodec, DamagedFilesNeverCrash) {
  // Random truncations and byte flips of a PNG (interlaced RGBA) and a JPEG: every result is a
  // decoded image or an InvalidArgument naming the file.
  std::string rows;
  for (int i = 0; i < 16 * 12 * 4; ++i) rows.push_back(static_cast<char>(i * 13));
  PngSpec spec{16, 12, PNG_COLOR_TYPE_RGB_ALPHA, 8, rows};
  spec.interlaced = true;
  Image rgb;
  rgb.width = 16;
  rgb.height = 12;
  rgb.channels = 3;
  rgb.pixels.assign(rows.begin(), rows.begin() + 16 * 12 * 3);
  const std::string files[] = {*EncodePng(spec), *EncodeJpeg(rgb)};
  std::mt19937_64 rng(11);
  for (const std::string& good : files) {
    for (int iter = 0; iter < 300; ++iter) {
      std::string bad = good.substr(0, rng() % (good.size() + 1));
      for (int k = static_cast<int>(rng() % 4); k > 0 && !bad.empty(); --k) {
        bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
      }
      absl::StatusOr<Image> img = DecodeImage(bad, "x/damaged");
      if (img.ok()) {
        EXPECT_EQ(img->pixels.size(),
                  static_cast<size_t>(img->width) * img->height * img->channels);
      } else {
        EXPECT_EQ(img.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(img.status().message().find("x/damaged"), std::string::npos);
      }
    }
  }
}

TEST(ImageTransform, ChannelsAndResize) {
  Image ga;
  ga.width = 2;
  ga.height = 1;
  ga.channels = 2;
  ga.pixels = V({100, 255, 100, 0});
  // Over white: opaque keeps 100, transparent becomes 255; to RGB copies.
  EXPECT_EQ(ConvertChannels(ga, 3, 255).pixels, V({100, 100, 100, 255, 255, 255}));
  EXPECT_EQ(ConvertChannels(ga, 1, 0).pixels, V({100, 0}));
  Image rgb;
  rgb.width = rgb.height = 1;
  rgb.channels = 3;
  rgb.pixels = V({255, 0, 0});
  EXPECT_EQ(ConvertChannels(rgb, 1).pixels, V({76}));  // 0.299 * 255 = 76.2

  Image g;
  g.width = 4;
  g.height = 2;
  g.channels = 1;
  g.pixels = V({0, 10, 20, 30, 40, 50, 60, 70});
  EXPECT_EQ(ResizeImage(g, 2, 4, ResizeMode::kFit).pixels, g.pixels);  // same size: identity
  // Area 4x2 -> 2x1: means of 2x2 blocks.
  EXPECT_EQ(ResizeImage(g, 1, 2, ResizeMode::kFit).pixels, V({25, 45}));
  // Crop 4x2 -> 2x2: the centre 2x2 columns 1..2.
  EXPECT_EQ(ResizeImage(g, 2, 2, ResizeMode::kCrop).pixels, V({10, 20, 50, 60}));
  // Bilinear 2x1 -> 4x1 (half-pixel centres): 0, 2.5, 7.5, 10 -> 0 3 8 10 (rounded).
  Image two;
  two.width = 2;
  two.height = 1;
  two.channels = 1;
  two.pixels = V({0, 10});
  EXPECT_EQ(ResizeImage(two, 1, 4, ResizeMode::kFit).pixels, V({0, 3, 8, 10}));
}

// A small labelled folder: red/ (PNG RGBA), gray/ (JPEG gray and 16-bit PNG), blue/ (JPEG RGB).
void MakeImageTree(const std::string& root, int per_label) {
  Env* env = Env::Default();
  for (const char* label : {"blue", "gray", "red"})
    ASSERT_TRUE(env->CreateDir(JoinPath(root, label)).ok());
  for (int i = 0; i < per_label; ++i) {
    std::string rgba;
    for (int p = 0; p < 12 * 10; ++p) rgba += Bytes({200 + i, p % 50, 10, p % 2 ? 255 : 100});
    ASSERT_TRUE(WriteStringToFile(env, *EncodePng({12, 10, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba}),
                                  JoinPath(root, "red/r" + std::to_string(i) + ".png"))
                    .ok());
    Image gray;
    gray.width = 9;
    gray.height = 14;
    gray.channels = 1;
    for (int p = 0; p < 9 * 14; ++p) gray.pixels.push_back(static_cast<uint8_t>(p * 3 + i));
    ASSERT_TRUE(WriteStringToFile(env, *EncodeJpeg(gray),
                                  JoinPath(root, "gray/g" + std::to_string(i) + ".JPG"))
                    .ok());
    std::string g16;
    for (int p = 0; p < 5 * 5; ++p) g16 += Bytes({p * 10, i});
    ASSERT_TRUE(WriteStringToFile(env, *EncodePng({5, 5, PNG_COLOR_TYPE_GRAY, 16, g16}),
                                  JoinPath(root, "gray/h" + std::to_string(i) + ".png"))
                    .ok());
    Image blue;
    blue.width = 20;
    blue.height = 6;
    blue.channels = 3;
    for (int p = 0; p < 20 * 6; ++p) {
      for (int c : {10, 20 + i, 220}) blue.pixels.push_back(static_cast<uint8_t>(c));
    }
    ASSERT_TRUE(WriteStringToFile(env, *EncodeJpeg(blue),
                                  JoinPath(root, "blue/b" + std::to_string(i) + ".jpeg"))
                    .ok());
  }
  ASSERT_TRUE(WriteStringToFile(env, "notes", JoinPath(root, "blue/README.txt")).ok());
}

std::map<std::string, std::string> DirFiles(const std::string& dir) {
  Env* env = Env::Default();
  std::map<std::string, std::string> out;
  const std::vector<std::string> names = *env->GetChildren(dir);
  for (const std::string& name : names) {
    if (name[0] == '.') continue;
    out[name] = *ReadFileToString(env, JoinPath(dir, name));
  }
  return out;
}

TEST(ImageImport, RecordsManifestAndDeterminismAcrossThreadCounts) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("image_import_test");
  const std::string src = JoinPath(tmp, "src");
  MakeImageTree(src, 5);
  ImageImportOptions o;
  o.src_dir = src;
  o.height = 8;
  o.width = 6;
  o.shards = 3;
  o.held_out = 0.2;
  o.seed = 4;
  std::vector<std::map<std::string, std::string>> runs;
  for (int threads : {1, 3}) {
    o.threads = threads;
    o.out_dir = JoinPath(tmp, "out" + std::to_string(threads));
    int64_t last_done = -1;
    absl::StatusOr<ImportSummary> s = ImportImages(env, o, [&](const ImportProgress& p) {
      EXPECT_GE(p.done, last_done);
      last_done = p.done;
      EXPECT_EQ(p.total, 20);
    });
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(last_done, 20);
    EXPECT_EQ(s->examples, 20);
    EXPECT_EQ(s->splits["held_out"], 4);
    EXPECT_EQ(s->splits["train"], 16);
    EXPECT_EQ(s->ignored, 1);  // README.txt
    EXPECT_EQ(s->shards, 4);   // 3 train + ceil(3 * 0.2) = 1 held_out
    runs.push_back(DirFiles(o.out_dir));
  }
  EXPECT_EQ(runs[0], runs[1]);  // shards and dataset.json byte for byte
  ASSERT_TRUE(runs[0].count("train-00002-of-00003.tfrecord"));
  ASSERT_TRUE(runs[0].count("held_out-00000-of-00001.tfrecord"));

  absl::StatusOr<DatasetManifest> m = ReadManifest(env, o.out_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->label_vocabulary, (std::vector<std::string>{"blue", "gray", "red"}));
  EXPECT_EQ(m->FindFeature("image")->shape, (std::vector<int64_t>{8, 6, 3}));
  EXPECT_TRUE(VerifyShards(env, o.out_dir, *m).ok());
  EXPECT_EQ(m->statistics["image"]["count"], 20 * 8 * 6);
  int64_t seen = 0;
  for (const ShardEntry& e : m->shards) {
    auto r = ExampleReader::Open(env, JoinPath(o.out_dir, e.file));
    ASSERT_TRUE(r.ok());
    Example ex;
    while (*(*r)->Next(&ex)) {
      ++seen;
      ASSERT_EQ(ex.features["image"].bytes_list.at(0).size(), 8u * 6 * 3);
      const std::string path = ex.features["path"].bytes_list.at(0);
      const int64_t label = ex.features["label"].int64_list.at(0);
      EXPECT_EQ(path.substr(0, path.find('/')), m->label_vocabulary[label]);
      const std::string& px = ex.features["image"].bytes_list[0];
      if (label == 1) {  // gray: the three channels equal
        EXPECT_EQ(px[0], px[1]);
        EXPECT_EQ(px[1], px[2]);
      }
      if (label == 0) {
        EXPECT_NEAR(static_cast<uint8_t>(px[2]), 220, 6);  // blue
      }
    }
  }
  EXPECT_EQ(seen, 20);
}

TEST(ImageImport, BadFilesFailOrAreSkippedByName) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("image_import_test");
  const std::string src = JoinPath(tmp, "src");
  MakeImageTree(src, 2);
  std::string png = *ReadFileToString(env, JoinPath(src, "red/r0.png"));
  ASSERT_TRUE(
      WriteStringToFile(env, png.substr(0, png.size() / 2), JoinPath(src, "red/trunc.png")).ok());
  ASSERT_TRUE(WriteStringToFile(env, "not an image", JoinPath(src, "blue/bad.jpg")).ok());
  ImageImportOptions o;
  o.src_dir = src;
  o.out_dir = JoinPath(tmp, "out");
  o.height = o.width = 4;
  o.shards = 1;
  o.held_out = 0;
  absl::StatusOr<ImportSummary> s = ImportImages(env, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("blue/bad.jpg"), std::string::npos) << s.status();
  EXPECT_FALSE(env->FileExists(JoinPath(o.out_dir, "dataset.json")));
  o.on_error = "skip";
  s = ImportImages(env, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->skipped, 2);
  EXPECT_EQ(s->examples, 8);
  absl::StatusOr<DatasetManifest> m = ReadManifest(env, o.out_dir);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->skipped.size(), 2u);
  EXPECT_EQ(m->skipped[0]["file"], "blue/bad.jpg");
  EXPECT_EQ(m->skipped[1]["file"], "red/trunc.png");
  // Bad options name the flag.
  o.channels = 2;
  EXPECT_NE(ImportImages(env, o).status().message().find("--channels"), std::string::npos);
}

TEST(ImageImport, ResumeKeepsVerifiedShardsAndRewritesTheRest) {
  Env* env = Env::Default();
  const std::string tmp = test_support::MakeTempDir("image_import_test");
  const std::string src = JoinPath(tmp, "src");
  MakeImageTree(src, 4);
  ImageImportOptions o;
  o.src_dir = src;
  o.out_dir = JoinPath(tmp, "out");
  o.height = o.width = 5;
  o.shards = 4;
  o.held_out = 0.25;
  o.threads = 2;
  ASSERT_TRUE(ImportImages(env, o).ok());
  const std::map<std::string, std::string> first = DirFiles(o.out_dir);
  // A kill mid-import: the manifest not yet written, shard 3 never renamed (a partial file
  // instead), shard 1 damaged on disk after it was recorded as finished.
  ASSERT_TRUE(env->DeleteFile(JoinPath(o.out_dir, "dataset.json")).ok());
  ASSERT_TRUE(env->DeleteFile(JoinPath(o.out_dir, "train-00003-of-00004.tfrecord")).ok());
  ASSERT_TRUE(
      WriteStringToFile(env, "torn", JoinPath(o.out_dir, ".train-00003-of-00004.tfrecord.partial"))
          .ok());
  const std::string s1 = JoinPath(o.out_dir, "train-00001-of-00004.tfrecord");
  std::string bytes = *ReadFileToString(env, s1);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteStringToFile(env, bytes, s1).ok());
  absl::StatusOr<ImportSummary> s = ImportImages(env, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->shards, 5);
  EXPECT_EQ(s->shards_kept, 3);
  EXPECT_EQ(DirFiles(o.out_dir), first);
  EXPECT_FALSE(env->FileExists(JoinPath(o.out_dir, ".train-00003-of-00004.tfrecord.partial")));
  // Other options: nothing kept, and the old plan's extra shards are removed.
  o.shards = 2;
  s = ImportImages(env, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shards_kept, 0);
  EXPECT_FALSE(env->FileExists(JoinPath(o.out_dir, "train-00003-of-00004.tfrecord")));
  EXPECT_TRUE(env->FileExists(JoinPath(o.out_dir, "train-00001-of-00002.tfrecord")));
}

}  // namespace
}  // namespace kiln::data
