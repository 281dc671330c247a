#include "runtime/cublas_loader.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "policies/error.h"

namespace twinstep::runtime {
namespace {

// Written once under `mu`, then published by `ready` (release); readers that see `ready` (acquire)
// read the table without the lock: the engine calls cublas_api() for every prefill GEMM.
struct Loaded {
  std::mutex mu;
  std::atomic<bool> ready{false};
  void* handle = nullptr;
  CublasApi api;
  std::string path;
};

Loaded& loaded() {
  static Loaded l;
  return l;
}

// Candidates in order: the directory of the libcudart this process runs with (the same
// toolkit's cuBLAS), then the bare soname for the dynamic loader's search path.
std::vector<std::string> candidates() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::vector<std::string> out;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cudaRuntimeGetVersion), &info) != 0 &&
      info.dli_fname != nullptr) {
    const std::string cudart = info.dli_fname;
    const size_t slash = cudart.rfind('/');
    if (slash != std::string::npos && cudart.find("libcudart", slash) != std::string::npos)
      out.push_back(cudart.substr(0, slash + 1) + soname);
  }
  out.push_back(soname);
  return out;
}

template <typename Fn>
void resolve(void* handle, const std::string& path, const char* name, Fn& fn) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    const char* why = dlerror();
    throw Error("cuBLAS: " + path + " has no entry point " + name +
                (why ? std::string(": ") + why : ""));
  }
  fn = reinterpret_cast<Fn>(sym);
}

}  // namespace

const CublasApi& cublas_api() {
  Loaded& l = loaded();
  if (l.ready.load(std::memory_order_acquire)) return l.api;
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.handle != nullptr) return l.api;
  std::string tried;
  void* handle = nullptr;
  std::string path;
  for (const std::string& c : candidates()) {
    handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      path = c;
      break;
    }
    const char* why = dlerror();
    tried += "\n  " + c + ": " + (why ? why : "not found");
  }
  if (handle == nullptr)
    throw Error("cuBLAS: cannot load libcublas (the real backend's prefill GEMM needs it); tried:" +
                tried);
  CublasApi api;
  try {
    resolve(handle, path, "cublasCreate_v2", api.create);
    resolve(handle, path, "cublasDestroy_v2", api.destroy);
    resolve(handle, path, "cublasSetStream_v2", api.set_stream);
    resolve(handle, path, "cublasSetMathMode", api.set_math_mode);
    resolve(handle, path, "cublasSetWorkspace_v2", api.set_workspace);
    resolve(handle, path, "cublasGemmEx", api.gemm_ex);
    resolve(handle, path, "cublasGetStatusString", api.status_string);
  } catch (...) {
    dlclose(handle);
    throw;
  }
  l.api = api;
  l.path = path;
  l.handle = handle;  // kept open for the process's life: handles and graphs refer to its code
  l.ready.store(true, std::memory_order_release);
  return l.api;
}

const char* cublas_library_path() {
  Loaded& l = loaded();
  if (l.ready.load(std::memory_order_acquire)) return l.path.c_str();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.path.c_str();
}

}  // namespace twinstep::runtime
