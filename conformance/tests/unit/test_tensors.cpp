#include "conformance/core/files.hpp"
#include "conformance/core/tensors.hpp"
#include "conformance/protocol/safetensors.hpp"
#include "conformance/tests/temp_dirs.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace gradcert {
namespace {

namespace fs = std::filesystem;

const std::string kLabel = "out/u0.grads.safetensors";

fs::path scratch_dir() { return test::scratch_dir("gradcert_tensors"); }

HostTensor tensor(const std::string& name, std::vector<int64_t> shape, std::vector<double> values, DType dtype) {
  HostTensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.held = std::move(values);
  t.dtype = dtype;
  return t;
}

std::vector<double> vals(const HostTensor& t) {
  const TensorValues v = t.read();
  return {v.begin(), v.end()};
}

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

std::string f32_bytes(std::vector<float> values) {
  std::string s(values.size() * 4, '\0');
  std::memcpy(s.data(), values.data(), s.size());
  return s;
}

// A safetensors file from a raw header and data section.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Two F32 tensors 'a' [2] and 'b' [2,1], contiguous.
std::string two_tensor_header() {
  return R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
         R"("b":{"dtype":"F32","shape":[2,1],"data_offsets":[8,16]}})";
}

std::string expect_error(const std::string& bytes, const std::map<std::string, TensorExpectation>& expect = {}) {
  try {
    parse_safetensors(kLabel, bytes, expect);
  } catch (const ArtifactError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ArtifactError";
  return "";
}

void expect_mentions(const std::string& message, const std::string& tensor = "") {
  EXPECT_EQ(message.rfind(kLabel, 0), 0u) << message;
  if (!tensor.empty()) {
    EXPECT_NE(message.find("'" + tensor + "'"), std::string::npos) << message;
  }
}

TensorMap round_trip(const TensorMap& tensors, const std::string& file) {
  const std::string path = (scratch_dir() / file).string();
  write_safetensors(path, tensors, {{"producer", "gradcert"}});
  TensorMap out = read_safetensors(path);
  for (auto& kv : out) kv.second.hold();  // read while the file is there
  fs::remove(path);
  return out;
}

TEST(Safetensors, DtypeNames) {
  for (DType d : {DType::Float64, DType::Float32, DType::BFloat16}) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(safetensors_dtype(DType::BFloat16), "BF16");
  try {
    parse_dtype("half");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'half' (expected float64, float32 or bfloat16)");
  }
}

TEST(Safetensors, RoundTripFloat64) {
  TensorMap in;
  in["w"] = tensor("w", {2, 3}, {1.0, -2.5, 1e-300, 3.141592653589793, 0.0, -0.0}, DType::Float64);
  in["v"] = tensor("v", {1}, {std::numeric_limits<double>::infinity()}, DType::Float64);
  TensorMap out = round_trip(in, "f64.safetensors");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out["w"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(vals(out["w"]), in["w"].held);
  EXPECT_EQ(out["w"].dtype, DType::Float64);
  EXPECT_EQ(out["w"].name, "w");
  EXPECT_TRUE(std::isinf(vals(out["v"])[0]));
}

TEST(Safetensors, RoundTripFloat32) {
  TensorMap in;
  in["x"] = tensor("x", {3}, {0.1, 1.5, -7.0}, DType::Float32);
  TensorMap out = round_trip(in, "f32.safetensors");
  EXPECT_EQ(out["x"].dtype, DType::Float32);
  EXPECT_EQ(vals(out["x"]), (std::vector<double>{static_cast<float>(0.1), 1.5, -7.0}));
}

TEST(Safetensors, RoundTripBFloat16RoundsToNearestEven) {
  TensorMap in;
  in["g"] =
      tensor("g", {5}, {1.00390625, 1.01171875, 1.0, -3.0, std::numeric_limits<double>::quiet_NaN()}, DType::BFloat16);
  TensorMap out = round_trip(in, "bf16.safetensors");
  const std::vector<double> v = vals(out["g"]);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(out["g"].dtype, DType::BFloat16);
  EXPECT_EQ(v[0], 1.0);       // halfway, ties to even mantissa
  EXPECT_EQ(v[1], 1.015625);  // halfway, rounds up to even
  EXPECT_EQ(v[2], 1.0);
  EXPECT_EQ(v[3], -3.0);
  EXPECT_TRUE(std::isnan(v[4]));
}

TEST(Safetensors, RoundTripScalarAndEmpty) {
  TensorMap in;
  in["loss"] = tensor("loss", {}, {2.25}, DType::Float32);
  in["none"] = tensor("none", {0}, {}, DType::Float64);
  TensorMap out = round_trip(in, "scalar.safetensors");
  EXPECT_TRUE(out["loss"].shape.empty());
  EXPECT_EQ(out["loss"].numel(), 1);
  EXPECT_EQ(vals(out["loss"]), (std::vector<double>{2.25}));
  EXPECT_EQ(out["none"].shape, (std::vector<int64_t>{0}));
  EXPECT_TRUE(vals(out["none"]).empty());
}

// A tensor read from a file (NOTE [streamed tensors]) holds no values until a reader asks, and
// a file that changed after its header was read is refused rather than read.
TEST(Safetensors, ReadStreamsValuesAndRefusesAFileThatChanged) {
  TensorMap in;
  in["w"] = tensor("w", {2, 2}, {1.0, -2.0, 0.5, 3.0}, DType::Float32);
  in["z"] = tensor("z", {3}, {0.25, 7.0, -1e300}, DType::Float64);
  const std::string path = (scratch_dir() / "streamed.safetensors").string();
  write_safetensors(path, in);
  const TensorMap out = read_safetensors(path, {{"w", {{2, 2}, DType::Float32}}, {"z", {{3}, DType::Float64}}});
  ASSERT_TRUE(out.at("w").streamed());
  EXPECT_TRUE(out.at("w").held.empty());
  EXPECT_EQ(vals(out.at("w")), in["w"].held);
  EXPECT_EQ(vals(out.at("z")), in["z"].held);
  in["w"].held[0] = 9.0;
  write_safetensors(path, in);  // another file under the same name
  try {
    (void)out.at("w").read();
    FAIL() << "a replaced file was read";
  } catch (const ArtifactError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("changed after gradcert read its header"), std::string::npos) << msg;
  }
  fs::remove(path);
}

TEST(Safetensors, WriterLayoutIsAlignedAndSorted) {
  TensorMap in;
  in["b"] = tensor("b", {1}, {2.0}, DType::Float32);
  in["a"] = tensor("a", {1}, {1.0}, DType::Float32);
  const std::string path = (scratch_dir() / "layout.safetensors").string();
  write_safetensors(path, in);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  fs::remove(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 8);
  EXPECT_EQ(bytes.substr(8 + n), f32_bytes({1.0f, 2.0f}));
}

TEST(Safetensors, WriterRejectsValueCountMismatch) {
  TensorMap in;
  in["w"] = tensor("w", {2, 2}, {1.0, 2.0, 3.0}, DType::Float64);
  const std::string path = (scratch_dir() / "bad.safetensors").string();
  try {
    write_safetensors(path, in);
    FAIL();
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ReadMissingFileNamesPath) {
  const std::string path = (scratch_dir() / "absent.safetensors").string();
  try {
    read_safetensors(path);
    FAIL();
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Safetensors, AcceptsPaddedHeaderAndMetadata) {
  std::string header = R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append(5, ' ');
  TensorMap out =
      parse_safetensors(kLabel, file_bytes(header, f32_bytes({1.0f, 2.0f})), {{"a", {{2}, DType::Float32}}});
  EXPECT_EQ(vals(out["a"]), (std::vector<double>{1.0, 2.0}));
}

TEST(Safetensors, RejectsTooShortFile) { expect_mentions(expect_error(std::string("\x08\x00\x00", 3))); }

TEST(Safetensors, RejectsTruncatedDataSection) {
  std::string bytes = file_bytes(two_tensor_header(), f32_bytes({1, 2, 3, 4}));
  bytes.resize(bytes.size() - 3);
  const std::string msg = expect_error(bytes);
  expect_mentions(msg, "b");
  EXPECT_NE(msg.find("beyond the data section"), std::string::npos) << msg;
}

TEST(Safetensors, RejectsHeaderLengthLargerThanFile) {
  std::string bytes = le64(4096) + two_tensor_header();
  expect_mentions(expect_error(bytes));
}

TEST(Safetensors, RejectsOversizedHeader) {
  std::string bytes = le64(200ull * 1024 * 1024) + "{}";
  const std::string msg = expect_error(bytes);
  expect_mentions(msg);
  EXPECT_NE(msg.find("100 MiB"), std::string::npos) << msg;
  expect_mentions(expect_error(le64(0) + "{}"));
  expect_mentions(expect_error(le64(~0ull) + "{}"));
}

TEST(Safetensors, RejectsBadJson) {
  expect_mentions(expect_error(file_bytes(R"({"a":{"dtype":"F32",)", "")));
  expect_mentions(expect_error(file_bytes("[1,2]", "")));
  expect_mentions(expect_error(file_bytes(std::string(10000, '[') + std::string(10000, ']'), "")));
  expect_mentions(expect_error(file_bytes(R"({"__metadata__":{"k":1}})", "")));
}

TEST(Safetensors, RejectsMalformedEntries) {
  const std::string data = f32_bytes({1, 2});
  for (const std::string& entry : {
           std::string(R"("x")"),
           std::string(R"({"shape":[2],"data_offsets":[0,8]})"),
           std::string(R"({"dtype":"F16","shape":[2],"data_offsets":[0,8]})"),
           std::string(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
           std::string(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})"),
           std::string(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
           std::string(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"),
           std::string(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
           std::string(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
           std::string(R"({"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]})"),
       }) {
    const std::string msg = expect_error(file_bytes(R"({"w":)" + entry + "}", data));
    expect_mentions(msg, "w");
  }
}

TEST(Safetensors, RejectsWrongShapeVsExpect) {
  const std::string msg = expect_error(file_bytes(two_tensor_header(), f32_bytes({1, 2, 3, 4})),
                                       {{"a", {{2}, DType::Float32}}, {"b", {{1, 2}, DType::Float32}}});
  expect_mentions(msg, "b");
  EXPECT_NE(msg.find("shape [2,1] but the plan expects [1,2]"), std::string::npos) << msg;
}

TEST(Safetensors, RejectsWrongDtypeVsExpect) {
  const std::string msg = expect_error(file_bytes(two_tensor_header(), f32_bytes({1, 2, 3, 4})),
                                       {{"a", {{2}, DType::BFloat16}}, {"b", {{2, 1}, DType::Float32}}});
  expect_mentions(msg, "a");
  EXPECT_NE(msg.find("bfloat16"), std::string::npos) << msg;
}

TEST(Safetensors, RejectsMissingTensor) {
  const std::string msg =
      expect_error(file_bytes(two_tensor_header(), f32_bytes({1, 2, 3, 4})),
                   {{"a", {{2}, DType::Float32}}, {"b", {{2, 1}, DType::Float32}}, {"c", {{1}, DType::Float32}}});
  expect_mentions(msg, "c");
  EXPECT_NE(msg.find("is missing"), std::string::npos) << msg;
}

TEST(Safetensors, RejectsExtraTensor) {
  const std::string msg =
      expect_error(file_bytes(two_tensor_header(), f32_bytes({1, 2, 3, 4})), {{"a", {{2}, DType::Float32}}});
  expect_mentions(msg, "b");
}

TEST(Safetensors, RejectsOverlappingOffsets) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  const std::string msg = expect_error(file_bytes(header, f32_bytes({1, 2, 3})));
  expect_mentions(msg, "b");
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

TEST(Safetensors, RejectsOffsetsSizeMismatch) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  const std::string msg = expect_error(file_bytes(header, f32_bytes({1, 2, 3})));
  expect_mentions(msg, "a");
}

}  // namespace
}  // namespace gradcert
