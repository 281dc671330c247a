#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/json_lite.h"

namespace twinstep {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
  int bytes;
};
constexpr DTypeName kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},   {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},   {DType::kI64, "I64", 8},        {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},   {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError(file + ": " + what);
}

std::string json_escape(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& file, const std::string& what) {
  if (a != 0 && b > UINT64_MAX / a) fail(file, what + ": size overflows 64 bits");
  return a * b;
}

}  // namespace

const char* dtype_name(DType d) {
  for (const DTypeName& n : kDTypes)
    if (n.dtype == d) return n.name;
  return "?";
}

int dtype_bytes(DType d) {
  for (const DTypeName& n : kDTypes)
    if (n.dtype == d) return n.bytes;
  return 0;
}

uint64_t TensorInfo::element_count() const {
  uint64_t n = 1;
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t data_bytes,
                                           const std::string& file) {
  JsonValue root;
  try {
    root = parse_json(header_json, 8);
  } catch (const JsonError& e) {
    fail(file, std::string("malformed safetensors header: ") + e.what());
  }
  if (root.kind != JsonValue::Kind::kObject) fail(file, "safetensors header is not a JSON object");
  SafetensorsHeader h;
  for (const auto& [name, v] : root.fields) {
    if (name == "__metadata__") {
      if (v.kind != JsonValue::Kind::kObject) fail(file, "__metadata__ is not an object");
      for (const auto& [k, mv] : v.fields) {
        if (mv.kind != JsonValue::Kind::kString)
          fail(file, "__metadata__ value of \"" + k + "\" is not a string");
        h.metadata.emplace_back(k, mv.text);
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (name.empty()) fail(file, "empty tensor name");
    if (v.kind != JsonValue::Kind::kObject) fail(file, where + ": entry is not an object");
    TensorInfo t;
    t.name = name;
    try {
      const JsonValue* dtype = v.find("dtype");
      const JsonValue* shape = v.find("shape");
      const JsonValue* offsets = v.find("data_offsets");
      if (!dtype || !shape || !offsets) fail(file, where + ": needs dtype, shape and data_offsets");
      for (const auto& [k, unused] : v.fields)
        if (k != "dtype" && k != "shape" && k != "data_offsets")
          fail(file, where + ": unknown field \"" + k + "\"");
      const std::string& dn = dtype->as_string(where + " dtype");
      bool known = false;
      for (const DTypeName& n : kDTypes)
        if (dn == n.name) {
          t.dtype = n.dtype;
          known = true;
        }
      if (!known) fail(file, where + ": unknown dtype \"" + dn + "\"");
      if (shape->kind != JsonValue::Kind::kArray) fail(file, where + ": shape is not an array");
      if (shape->items.size() > 8) fail(file, where + ": more than 8 dimensions");
      uint64_t elements = 1;
      for (const JsonValue& d : shape->items) {
        const uint64_t dim = d.as_u64(where + " shape");
        if (dim > (uint64_t{1} << 40)) fail(file, where + ": dimension " + d.text + " too large");
        t.shape.push_back(static_cast<int64_t>(dim));
        elements = checked_mul(elements, dim, file, where);
      }
      const uint64_t bytes =
          checked_mul(elements, static_cast<uint64_t>(dtype_bytes(t.dtype)), file, where);
      if (offsets->kind != JsonValue::Kind::kArray || offsets->items.size() != 2)
        fail(file, where + ": data_offsets must be [begin, end]");
      t.begin = offsets->items[0].as_u64(where + " data_offsets");
      t.end = offsets->items[1].as_u64(where + " data_offsets");
      if (t.end < t.begin)
        fail(file, where + ": data_offsets end " + std::to_string(t.end) + " < begin " +
                       std::to_string(t.begin));
      if (t.end > data_bytes)
        fail(file, where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + ") run past the data section (" +
                       std::to_string(data_bytes) + " bytes)");
      if (t.end - t.begin != bytes)
        fail(file, where + ": shape × " + dtype_name(t.dtype) + " is " + std::to_string(bytes) +
                       " bytes but data_offsets span " + std::to_string(t.end - t.begin));
    } catch (const JsonError& e) {
      fail(file, e.what());
    }
    h.tensors.push_back(std::move(t));
  }
  // Ranges must tile the data section exactly: no overlaps, no holes (the format's rule).
  std::vector<const TensorInfo*> sorted;
  for (const TensorInfo& t : h.tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const TensorInfo* t : sorted) {
    if (t->begin < at)
      fail(file, "tensor \"" + t->name + "\" overlaps the previous tensor (begins at " +
                     std::to_string(t->begin) + ", previous ends at " + std::to_string(at) + ")");
    if (t->begin > at)
      fail(file, "hole in the data section before tensor \"" + t->name + "\" (bytes " +
                     std::to_string(at) + ".." + std::to_string(t->begin) + " unused)");
    at = t->end;
  }
  if (at != data_bytes)
    fail(file, "data section has " + std::to_string(data_bytes - at) +
                   " trailing bytes not owned by any tensor");
  return h;
}

SafetensorsHeader parse_safetensors_image(std::span<const std::byte> image,
                                          const std::string& file) {
  if (image.size() < 8)
    fail(file,
         "file is " + std::to_string(image.size()) + " bytes, shorter than the 8-byte header size");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(image[size_t(i)]);
  if (n > kMaxSafetensorsHeaderBytes)
    fail(file, "header size " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > image.size() - 8)
    fail(file, "header size " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(image.size()) + " bytes)");
  const std::string_view json(reinterpret_cast<const char*>(image.data() + 8), size_t(n));
  return parse_safetensors_header(json, image.size() - 8 - n, file);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(e));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_bytes_ = static_cast<size_t>(st.st_size);
  if (f->map_bytes_ > 0) {
    void* p = ::mmap(nullptr, f->map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail(path, std::string("cannot map: ") + std::strerror(e));
    }
    f->map_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  f->header_ = parse_safetensors_image({f->map_, f->map_bytes_}, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(f->map_[i]);
  f->data_ = f->map_ + 8 + n;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_bytes_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const TensorInfo& t : header_.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const TensorInfo& t) const {
  return {data_ + t.begin, size_t(t.end - t.begin)};
}

void write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::ostringstream h;
  h << '{';
  bool first = true;
  if (!metadata.empty()) {
    h << "\"__metadata__\":{";
    for (size_t i = 0; i < metadata.size(); ++i)
      h << (i ? "," : "") << json_escape(metadata[i].first) << ':'
        << json_escape(metadata[i].second);
    h << '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const TensorSource& t : tensors) {
    uint64_t elements = 1;
    for (const int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    const uint64_t bytes = elements * static_cast<uint64_t>(dtype_bytes(t.dtype));
    h << (first ? "" : ",") << json_escape(t.name) << ":{\"dtype\":\"" << dtype_name(t.dtype)
      << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) h << (i ? "," : "") << t.shape[i];
    h << "],\"data_offsets\":[" << offset << ',' << offset + bytes << "]}";
    offset += bytes;
    first = false;
  }
  h << '}';
  std::string header = h.str();
  while (header.size() % 8 != 0) header += ' ';

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot create");
  uint8_t size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = static_cast<uint8_t>(uint64_t(header.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(size_le), 8);
  out.write(header.data(), std::streamsize(header.size()));
  constexpr uint64_t kChunkElements = 1 << 20;
  std::vector<std::byte> buf;
  for (const TensorSource& t : tensors) {
    uint64_t elements = 1;
    for (const int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    const auto eb = static_cast<uint64_t>(dtype_bytes(t.dtype));
    for (uint64_t at = 0; at < elements; at += kChunkElements) {
      const uint64_t n = std::min(kChunkElements, elements - at);
      buf.resize(n * eb);
      t.fill(buf.data(), at, n);
      out.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    }
  }
  out.close();
  if (!out) fail(path, "write failed (disk full?)");
}

}  // namespace twinstep
