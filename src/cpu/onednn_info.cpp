// onednn_info.cpp — the loaded oneDNN's version and the kernel set it dispatches to on this CPU (onednn_info.h).
#include "onednn_info.h"

#if FERRY_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "ferry/error.h"

namespace ferry::cpu {

#if FERRY_HAVE_ONEDNN
namespace {
const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
  }
}
}  // namespace

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  return detail::concat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (",
                        isa_name(dnnl::get_effective_cpu_isa()), " kernels)");
}
#else
std::string onednn_description() { return ""; }
#endif

}  // namespace ferry::cpu
