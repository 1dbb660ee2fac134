// openblas_info.cpp — the words for the cpu's BLAS and its kernels.
// Not here: why they matter (openblas_info.h).
#include "openblas_info.h"

#include <cblas.h>
#include <strings.h>

#include <cstdlib>

namespace ferry::cpu {

bool is_avx512_kernel_set(const std::string& corename) {
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (strcasecmp(corename.c_str(), wide) == 0) return true;
  return false;
}

std::string describe_openblas(const std::string& config, const std::string& corename, const char* coretype_variable,
                              bool cpu_has_avx512) {
  // config: "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the name and version are its first two words
  const std::size_t first = config.find(' ');
  const std::size_t second = first == std::string::npos ? first : config.find(' ', first + 1);
  std::string text = config.substr(0, second) + ", " + corename + " kernels";
  // only an OpenBLAS built for every core reads the variable; one built for a single target has no choice
  if (coretype_variable == nullptr || config.find("DYNAMIC_ARCH") == std::string::npos) return text;
  text += " (OPENBLAS_CORETYPE=";
  text += coretype_variable;
  if (cpu_has_avx512 && !is_avx512_kernel_set(corename))
    text += ": kernels without AVX-512 on a CPU that has it";
  return text + ")";
}

std::string openblas_description() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  return describe_openblas(openblas_get_config(), openblas_get_corename(), std::getenv("OPENBLAS_CORETYPE"), avx512);
}

}  // namespace ferry::cpu
