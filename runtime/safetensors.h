// Safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// size N, N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data section. Offsets are relative to the data
// section. The header is untrusted input: every structural rule is checked (sizes, dtypes,
// shape × dtype size == byte range, ranges inside the data section, no overlaps, no holes) and
// every failure is a CheckpointError naming the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "policies/error.h"

namespace twinstep {

class CheckpointError : public Error {
 public:
  using Error::Error;
};

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kI64,
  kU64,
  kF64,
  kF8E4M3,
  kF8E5M2
};
const char* dtype_name(DType d);  // the safetensors spelling: "BF16", "F32", ...
int dtype_bytes(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section, [begin, end)
  uint64_t end = 0;
  uint64_t element_count() const;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;
};

// Largest header accepted (the reference implementation's limit).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Validates a header against a data section of `data_bytes`. `file` names the file in errors.
SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_bytes,
                                           const std::string& file);

// Validates a whole file image (header size prefix, header, data section).
SafetensorsHeader parse_safetensors_image(std::span<const std::byte> image,
                                          const std::string& file);

// A read-only memory-mapped safetensors file. Not copyable; the mapping lives as long as it.
class SafetensorsFile {
 public:
  // Throws CheckpointError when the file cannot be opened or fails validation.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent
  std::span<const std::byte> bytes(const TensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  const std::byte* map_ = nullptr;
  size_t map_bytes_ = 0;
  const std::byte* data_ = nullptr;  // start of the data section
};

// A tensor to write: fill(dst, offset_elements, count) writes elements
// [offset, offset + count) of the tensor, in row-major order, as raw little-endian bytes.
struct TensorSource {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::function<void(std::byte* dst, uint64_t offset, uint64_t count)> fill;
};

// Writes a safetensors file, tensors in the given order, data streamed in chunks (a tensor need
// not fit in memory). The header is padded with spaces to a multiple of 8 bytes.
void write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata = {});

}  // namespace twinstep
