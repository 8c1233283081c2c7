// tf.train.Example, encoded and decoded by hand over the protobuf wire format: the payload of
// every record in the shards `kiln data import` writes (docs/formats.md "Example records"), so
// TensorFlow's tf.data reads Kiln's shards and Kiln reads TensorFlow's.
//
//   Example ex;
//   ex.features["image"] = Feature::Bytes({pixels});
//   ex.features["label"] = Feature::Int64s({3});
//   std::string payload = EncodeExample(ex);          // deterministic: keys in sorted order
//   KILN_ASSIGN_OR_RETURN(Example back, DecodeExample(payload));
//
// The messages (tensorflow/core/example/{example,feature}.proto):
//   Example   { Features features = 1; }
//   Features  { map<string, Feature> feature = 1; }   // entry: { string key = 1; Feature value =
//   2; } Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                            Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }
//   FloatList { repeated float value = 1 [packed = true]; }
//   Int64List { repeated int64 value = 1 [packed = true]; }
//
// Writing: fields in number order, map entries in ascending key order, float and int64 lists
// packed (as TensorFlow writes them), a negative int64 as its 10-byte two's-complement varint.
// Reading follows protobuf's rules: packed and unpacked repeated fields both accepted, unknown
// fields skipped, a message field seen twice merged (lists appended; a different oneof member
// replaces the earlier one), a repeated map key keeps the last value. Anything malformed
// (truncated varint or field, a length past its message, wire types 3/4/6/7, a field number 0,
// a packed float run not a multiple of 4 bytes) is DataLoss "tf.train.Example: ... at byte N".
#ifndef KILN_DATA_EXAMPLE_PROTO_H_
#define KILN_DATA_EXAMPLE_PROTO_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::data {

struct Feature {
  enum class Kind { kNone, kBytes, kFloat, kInt64 };  // kNone: no oneof member set
  Kind kind = Kind::kNone;
  std::vector<std::string> bytes_list;  // used when kind == kBytes
  std::vector<float> float_list;        // kFloat
  std::vector<int64_t> int64_list;      // kInt64

  static Feature Bytes(std::vector<std::string> v);
  static Feature Floats(std::vector<float> v);
  static Feature Int64s(std::vector<int64_t> v);
  bool operator==(const Feature& o) const;
};

struct Example {
  std::map<std::string, Feature> features;
  bool operator==(const Example& o) const { return features == o.features; }
};

std::string EncodeExample(const Example& example);
// Appends the encoding to *out (reusing its capacity).
void EncodeExampleTo(const Example& example, std::string* out);
absl::StatusOr<Example> DecodeExample(std::string_view bytes);

// "bytes", "float", "int64", "none".
const char* FeatureKindName(Feature::Kind kind);

}  // namespace kiln::data

#endif  // KILN_DATA_EXAMPLE_PROTO_H_
