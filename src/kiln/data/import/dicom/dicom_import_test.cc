#include "kiln/data/import/dicom/dicom_import.h"

#include <gdcmImageWriter.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kiln/base/env.h"
#include "kiln/data/dataset_manifest.h"
#include "kiln/data/shard_io.h"
#include "tests/support/temp_dir.h"

namespace kiln::data {
namespace {

struct Spec {
  std::string modality = "CT";
  gdcm::PhotometricInterpretation::PIType pi = gdcm::PhotometricInterpretation::MONOCHROME2;
  int width = 2, height = 2, frames = 1;
  std::vector<int16_t> values;  // width * height * frames, stored (signed 16-bit)
  double slope = 1, intercept = 0;
  std::string window;  // "C\\W" or empty
};

// A DICOM file written by GDCM's own writer (explicit VR little endian).
void WriteDicom(const std::string& path, const Spec& s) {
  gdcm::ImageWriter w;
  gdcm::Image& im = w.GetImage();
  im.SetNumberOfDimensions(s.frames > 1 ? 3 : 2);
  im.SetDimension(0, s.width);
  im.SetDimension(1, s.height);
  if (s.frames > 1) im.SetDimension(2, s.frames);
  im.SetPixelFormat(gdcm::PixelFormat::INT16);
  im.SetPhotometricInterpretation(s.pi);
  im.SetSlope(s.slope);
  im.SetIntercept(s.intercept);
  gdcm::DataElement px(gdcm::Tag(0x7fe0, 0x0010));
  px.SetByteValue(reinterpret_cast<const char*>(s.values.data()),
                  static_cast<uint32_t>(s.values.size() * sizeof(int16_t)));
  im.SetDataElement(px);
  gdcm::DataSet& ds = w.GetFile().GetDataSet();
  auto set = [&](uint16_t g, uint16_t e, gdcm::VR vr, std::string v) {
    if (v.size() % 2) v.push_back(' ');  // DICOM values have even lengths
    gdcm::DataElement de(gdcm::Tag(g, e));
    de.SetVR(vr);
    de.SetByteValue(v.data(), static_cast<uint32_t>(v.size()));
    ds.Replace(de);
  };
  set(0x0008, 0x0060, gdcm::VR::CS, s.modality);
  if (!s.window.empty()) {
    const size_t cut = s.window.find('\\');
    set(0x0028, 0x1050, gdcm::VR::DS, s.window.substr(0, cut));
    set(0x0028, 0x1051, gdcm::VR::DS, s.window.substr(cut + 1));
  }
  w.SetFileName(path.c_str());
  ASSERT_TRUE(w.Write()) << path;
}

// The records of a one-shard import, in order.
std::vector<Example> ReadAll(const std::string& dir, const std::string& file) {
  std::vector<Example> out;
  auto r = ExampleReader::Open(Env::Default(), dir + "/" + file);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  for (;;) {
    Example ex;
    absl::StatusOr<bool> got = (*r)->Next(&ex);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || !*got) break;
    out.push_back(ex);
  }
  return out;
}

std::string Pixels(const Example& ex) { return ex.features.at("image").bytes_list.at(0); }
std::string Path(const Example& ex) { return ex.features.at("path").bytes_list.at(0); }

TEST(DicomImport, WindowFunctionFollowsTheStandard) {
  // C = 40, W = 400: v <= -160 -> 0, v > 239 -> 255, linear between (PS3.3 C.11.2.1.2.1).
  EXPECT_EQ(ApplyWindow(-1000, 40, 400), 0);
  EXPECT_EQ(ApplyWindow(-160, 40, 400), 0);
  EXPECT_EQ(ApplyWindow(240, 40, 400), 255);
  EXPECT_EQ(ApplyWindow(39.5, 40, 400), 128);  // ((39.5 - 39.5) / 399 + 0.5) * 255 = 127.5
  EXPECT_EQ(ApplyWindow(139.5, 40, 400), 191);
}

class DicomImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_support::MakeTempDir("dicom_import_test");
    src_ = dir_ + "/src";
    std::filesystem::create_directories(src_ + "/a");
    // CT: stored -> HU = v - 1024, the file's window 40/400.
    WriteDicom(src_ + "/a/ct.dcm", {"CT",
                                    gdcm::PhotometricInterpretation::MONOCHROME2,
                                    2,
                                    2,
                                    1,
                                    {0, 1024 - 160, 1024 + 40, 2000},
                                    1,
                                    -1024,
                                    "40\\400"});
    // MR without a window: its own range, min -> 0, max -> 255.
    WriteDicom(src_ + "/mr.dcm",
               {"MR", gdcm::PhotometricInterpretation::MONOCHROME2, 2, 2, 1, {10, 20, 30, 110}});
    // CR in MONOCHROME1 (0 = white), doubled by its slope: inverted after the window.
    WriteDicom(
        src_ + "/cr.dcm",
        {"CR", gdcm::PhotometricInterpretation::MONOCHROME1, 2, 2, 1, {0, 50, 100, 100}, 2, 0});
    std::ofstream(src_ + "/notes.txt") << "not a DICOM file\n";
  }
  DicomImportOptions Options(const std::string& out) {
    DicomImportOptions o;
    o.src_dir = src_;
    o.out_dir = dir_ + "/" + out;
    o.height = o.width = 2;
    o.shards = 1;
    o.held_out = 0;
    o.on_error = "skip";
    o.threads = 2;
    return o;
  }
  std::string dir_, src_;
};

TEST_F(DicomImportTest, RescaleWindowAndInversionGiveTheExpectedPixels) {
  absl::StatusOr<ImportSummary> s = ImportDicom(Env::Default(), Options("out"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->examples, 3);
  EXPECT_EQ(s->skipped, 1);  // notes.txt
  absl::StatusOr<DatasetManifest> m = ReadManifest(Env::Default(), dir_ + "/out");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->label_vocabulary, (std::vector<std::string>{"CR", "CT", "MR"}));
  ASSERT_EQ(m->skipped.size(), 1u);
  EXPECT_EQ(m->skipped[0]["file"], "notes.txt");
  std::map<std::string, std::string> px;
  for (const Example& ex : ReadAll(dir_ + "/out", "train-00000-of-00001.tfrecord"))
    px[Path(ex)] = Pixels(ex);
  ASSERT_EQ(px.size(), 3u);
  auto u8 = [](std::initializer_list<int> v) { return std::string(v.begin(), v.end()); };
  // CT HU -1024, -160, 40, 976 through 40/400.
  EXPECT_EQ(px["a/ct.dcm"], u8({0, 0, ApplyWindow(40, 40, 400), 255}));
  // MR 10..110: window C = 60.5, W = 101 -> 0 .. 255.
  EXPECT_EQ(px["mr.dcm"], u8({0, ApplyWindow(20, 60.5, 101), ApplyWindow(30, 60.5, 101), 255}));
  // CR 0, 100, 200, 200 over its range, inverted.
  EXPECT_EQ(px["cr.dcm"], u8({255, 255 - ApplyWindow(100, 100.5, 201), 0, 0}));
}

TEST_F(DicomImportTest, FailModeNamesTheBadFile) {
  DicomImportOptions o = Options("fail");
  o.on_error = "fail";
  absl::StatusOr<ImportSummary> s = ImportDicom(Env::Default(), o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("notes.txt"), std::string::npos) << s.status();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/fail/dataset.json"));
}

TEST_F(DicomImportTest, MultiFrameFilesGiveOneExamplePerFrameWithAll) {
  WriteDicom(src_ + "/cine.dcm", {"XA",
                                  gdcm::PhotometricInterpretation::MONOCHROME2,
                                  2,
                                  2,
                                  3,
                                  {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
                                  1,
                                  0,
                                  "5.5\\12"});
  DicomImportOptions o = Options("frames");
  o.frames = "all";
  absl::StatusOr<ImportSummary> s = ImportDicom(Env::Default(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->examples, 6);  // ct, mr, cr, 3 frames
  std::map<std::string, std::string> px;
  for (const Example& ex : ReadAll(dir_ + "/frames", "train-00000-of-00001.tfrecord"))
    px[Path(ex)] = Pixels(ex);
  ASSERT_TRUE(px.count("cine.dcm#2"));
  EXPECT_EQ(px["cine.dcm#2"][3], static_cast<char>(ApplyWindow(11, 5.5, 12)));
  EXPECT_NE(px["cine.dcm#0"], px["cine.dcm#1"]);
}

TEST_F(DicomImportTest, ShardsDoNotDependOnTheThreadCountAndLabelsMayComeFromACsv) {
  DicomImportOptions one = Options("t1"), three = Options("t3");
  one.threads = 1;
  three.threads = 3;
  one.height = one.width = three.height = three.width = 5;  // resized
  ASSERT_TRUE(ImportDicom(Env::Default(), one).ok());
  ASSERT_TRUE(ImportDicom(Env::Default(), three).ok());
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(dir_ + "/t1/train-00000-of-00001.tfrecord"),
            bytes(dir_ + "/t3/train-00000-of-00001.tfrecord"));
  std::ofstream(dir_ + "/labels.csv") << "a/ct.dcm,abnormal\nmr.dcm,normal\n";
  DicomImportOptions csv = Options("csv");
  csv.labels_csv = dir_ + "/labels.csv";
  absl::StatusOr<ImportSummary> s = ImportDicom(Env::Default(), csv);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->examples, 2);  // the CSV names two files; the others are ignored
  absl::StatusOr<DatasetManifest> m = ReadManifest(Env::Default(), dir_ + "/csv");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->label_vocabulary, (std::vector<std::string>{"abnormal", "normal"}));
}

// Debian's pydicom ships real files in several transfer syntaxes (deps-and-data.md §10): RLE,
// big endian, JPEG lossy, JPEG 2000 and RGB. Skipped where the package is absent.
TEST(DicomImportRealFiles, CompressedTransferSyntaxesDecode) {
  const std::string data = "/usr/lib/python3/dist-packages/pydicom/data/test_files";
  // File -> its encoding, as the label (GDCMJ2K_TextGBR.dcm has no Modality).
  const std::map<std::string, std::string> files = {
      {"CT_small.dcm", "explicit_le"},           {"MR_small_RLE.dcm", "rle"},
      {"MR_small_bigendian.dcm", "explicit_be"}, {"JPEG-lossy.dcm", "jpeg_12bit"},
      {"SC_rgb_jpeg_dcmd.dcm", "jpeg_rgb"},      {"GDCMJ2K_TextGBR.dcm", "jpeg2000"}};
  if (!std::filesystem::exists(data + "/CT_small.dcm")) GTEST_SKIP() << data << " not present";
  const std::string dir = test_support::MakeTempDir("dicom_real");
  std::filesystem::create_directories(dir + "/src");
  std::ofstream csv(dir + "/labels.csv");
  for (const auto& [n, label] : files) {
    std::filesystem::copy_file(data + "/" + n, dir + "/src/" + n);
    csv << n << "," << label << "\n";
  }
  csv.close();
  DicomImportOptions o;
  o.labels_csv = dir + "/labels.csv";
  o.src_dir = dir + "/src";
  o.out_dir = dir + "/out";
  o.height = o.width = 32;
  o.shards = 1;
  o.held_out = 0;
  absl::StatusOr<ImportSummary> s = ImportDicom(Env::Default(), o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->examples, static_cast<int64_t>(files.size()));
  absl::StatusOr<DatasetManifest> m = ReadManifest(Env::Default(), o.out_dir);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->label_vocabulary.size(), files.size());
  for (const Example& ex : ReadAll(o.out_dir, "train-00000-of-00001.tfrecord")) {
    const std::string px = Pixels(ex);
    ASSERT_EQ(px.size(), 32u * 32u);
    EXPECT_NE(px.find_first_not_of(px[0]), std::string::npos) << Path(ex) << " is flat";
  }
}

}  // namespace
}  // namespace kiln::data
