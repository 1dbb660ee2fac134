// cublas_library.cpp — finding cuBLAS on first use (dlopen), or, on the emulated card, taking the emulator's.
// Not here: which calls there are (cublas_library.h) and what they do (gemm.cpp).
#include "cublas_library.h"

#include <dlfcn.h>

#include "ferry/error.h"

namespace ferry::cuda {

CublasLibrary load_cublas(const std::vector<std::string>& files) {
  std::string tried;  // "file: why; file: why"
  for (const std::string& file : files) {
    // RTLD_NOW: a library that cannot resolve its own symbols fails here, not in the middle of a GEMM.
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      tried += ferry::detail::concat(tried.empty() ? "" : "; ", why ? why : file + ": cannot be opened");
      continue;
    }
    CublasLibrary library;
    const char* missing = nullptr;
#define FERRY_CUBLAS_RESOLVE(name)                                                     \
  if (missing == nullptr) {                                                            \
    library.name = reinterpret_cast<decltype(library.name)>(dlsym(handle, #name));     \
    if (library.name == nullptr) missing = #name;                                      \
  }
    FERRY_CUBLAS_FUNCTIONS(FERRY_CUBLAS_RESOLVE)
#undef FERRY_CUBLAS_RESOLVE
    if (missing != nullptr) {
      dlclose(handle);
      throw BackendError(ferry::detail::concat("cuBLAS: ", file, " opened but has no ", missing,
                                               ": it is not the cuBLAS ferry was built for (CUDA ", CUBLAS_VER_MAJOR,
                                               "'s libcublas)"));
    }
    return library;  // the handle is kept: cuBLAS stays loaded until the process ends
  }
  throw BackendError(ferry::detail::concat(
      "cuBLAS could not be loaded, so GEMMs on cuda devices cannot run (", tried,
      "). ferry was built against CUDA ", CUBLAS_VER_MAJOR,
      "'s cuBLAS: install it, or put the folder that holds libcublas.so.", CUBLAS_VER_MAJOR, " in LD_LIBRARY_PATH"));
}

const CublasLibrary& cublas_library() {
#ifdef FERRY_CUBLAS_SONAME  // the real build (src/CMakeLists.txt): nothing of cuBLAS is linked
  static const CublasLibrary library = load_cublas({FERRY_CUBLAS_SONAME, FERRY_CUBLAS_PATH});
#else  // the emulated card: the emulator's cuBLAS is linked in (tests/cuda_on_host/cublas.cpp)
  static const CublasLibrary library = [] {
    CublasLibrary linked;
#define FERRY_CUBLAS_LINKED(name) linked.name = &::name;
    FERRY_CUBLAS_FUNCTIONS(FERRY_CUBLAS_LINKED)
#undef FERRY_CUBLAS_LINKED
    return linked;
  }();
#endif
  return library;
}

std::string cublas_description() {
  try {
    const CublasLibrary& cublas = cublas_library();
    int major = 0, minor = 0, patch = 0;
    if (cublas.cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        cublas.cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
        cublas.cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS) {
      return "cuBLAS (GEMM), ";
    }
    return ferry::detail::concat("cuBLAS ", major, ".", minor, ".", patch, " (GEMM), ");
  } catch (const BackendError& e) {
    return ferry::detail::concat("cuBLAS missing: ", e.what(), "; ");
  }
}

}  // namespace ferry::cuda
