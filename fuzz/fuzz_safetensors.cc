// Fuzz target: bytes -> safetensors parsing (runtime/safetensors.h). The input is read two ways:
// as a whole file image (parse_safetensors_image, and SafetensorsFile::open on the same bytes
// written to a file), and as an 8-byte little-endian data-section size followed by header JSON
// (parse_safetensors_header), which reaches offsets near 2^64 without gigabyte inputs.
// Contract: every input either parses or throws CheckpointError; a parsed header is checked here
// against the format's rules computed independently (128-bit sizes): known dtypes, range size =
// shape product x dtype size, ranges tile the data section exactly, unique non-empty names, and
// the mapped file's tensor bytes equal the input's.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/safetensors.h"

namespace {

using twinstep::SafetensorsHeader;
using twinstep::TensorInfo;

void require(bool ok, const std::string& what) {
  twinstep::fuzz::require(ok, "fuzz_safetensors", what);
}

void check_header(const SafetensorsHeader& h, uint64_t data_bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string_view> names;
  for (const TensorInfo& t : h.tensors) {
    require(!t.name.empty() && t.name != "__metadata__", "tensor name is a real name");
    const int eb = twinstep::dtype_bytes(t.dtype);
    require(eb == 1 || eb == 2 || eb == 4 || eb == 8, "known dtype");
    unsigned __int128 bytes = static_cast<unsigned>(eb);
    for (const int64_t d : t.shape) {
      require(d >= 0, "dimension >= 0");
      bytes *= static_cast<unsigned __int128>(d);
      if (bytes > data_bytes) break;  // stays small enough not to wrap 128 bits
    }
    require(t.begin <= t.end && t.end <= data_bytes, "range inside the data section");
    require(bytes == t.end - t.begin, "range size = shape product x dtype size: " + t.name);
    require(t.element_count() * uint64_t(eb) == t.end - t.begin, "element_count agrees");
    ranges.emplace_back(t.begin, t.end);
    names.push_back(t.name);
  }
  std::sort(names.begin(), names.end());
  require(std::adjacent_find(names.begin(), names.end()) == names.end(), "names are unique");
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    require(b == at, "ranges tile the data section (no overlap, no hole)");
    at = e;
  }
  require(at == data_bytes, "ranges cover the data section");
}

twinstep::fuzz::ScratchDir& scratch() {
  static twinstep::fuzz::ScratchDir dir("fuzz_safetensors");
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy: ASan sees any read past the input.
  const std::vector<std::byte> image(reinterpret_cast<const std::byte*>(data),
                                     reinterpret_cast<const std::byte*>(data) + size);

  // 1. The whole file image.
  bool image_ok = false;
  SafetensorsHeader parsed;
  try {
    parsed = twinstep::parse_safetensors_image(image, "f.safetensors");
    image_ok = true;
  } catch (const twinstep::CheckpointError& e) {
    require(std::string_view(e.what()).starts_with("f.safetensors: "), "error names the file");
  }
  uint64_t header_len = 0;
  if (size >= 8) {
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  }
  if (image_ok) {
    require(size >= 8 && header_len <= size - 8, "accepted header fits in the file");
    check_header(parsed, size - 8 - header_len);
  }

  // 2. The same bytes through a file: open() must agree with the image parse and map exactly the
  // tensor bytes of the input.
  const std::string path =
      scratch().write("f.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const auto f = twinstep::SafetensorsFile::open(path);
    require(image_ok, "open() accepts only what the image parse accepts");
    require(f->header().tensors.size() == parsed.tensors.size(), "same tensor count");
    for (const TensorInfo& t : f->header().tensors) {
      const std::span<const std::byte> b = f->bytes(t);
      require(b.size() == t.end - t.begin, "bytes() size");
      require(b.empty() || std::memcmp(b.data(), data + 8 + header_len + t.begin, b.size()) == 0,
              "bytes() are the input's bytes of " + t.name);
      require(f->find(t.name) != nullptr, "find() finds every tensor");
    }
  } catch (const twinstep::CheckpointError&) {
    require(!image_ok, "open() rejects only what the image parse rejects");
  }

  // 3. A data-section size of up to 2^64 - 1 followed by header JSON.
  if (size >= 8) {
    uint64_t data_bytes = 0;
    for (int i = 7; i >= 0; --i) data_bytes = (data_bytes << 8) | data[i];
    const std::string json(reinterpret_cast<const char*>(data) + 8, size - 8);
    try {
      check_header(twinstep::parse_safetensors_header(json, data_bytes, "h.json"), data_bytes);
    } catch (const twinstep::CheckpointError& e) {
      require(std::string_view(e.what()).starts_with("h.json: "), "error names the file");
    }
  }
  return 0;
}
