// parallel_cost.cpp — the factor on the host loops' work thresholds (parallel_cost.h).
#include "parallel_cost.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "ferry/backend.h"
#include "ferry/error.h"

namespace ferry::cpu {

namespace {

bool is_passive(std::string_view policy) {
  constexpr std::string_view kPassive = "passive";
  if (policy.size() != kPassive.size()) return false;
  for (std::size_t i = 0; i < policy.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(policy[i])) != kPassive[i]) return false;
  }
  return true;
}

}  // namespace

std::int64_t parallel_work_scale_for(const char* omp_wait_policy, const char* ferry_parallel_scale) {
  if (ferry_parallel_scale != nullptr && *ferry_parallel_scale != '\0') {
    const std::string_view text(ferry_parallel_scale);
    std::int64_t scale = 0;
    const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), scale);
    FERRY_CHECK(error == std::errc{} && stop == text.data() + text.size() && scale >= 1 && scale <= 4096,
                InvalidArgument, "FERRY_PARALLEL_SCALE='", detail::printable(text),
                "': expected a whole number from 1 to 4096 (the factor on the work a host loop needs before it ",
                "splits over the threads), or unset (1; ", kSleepingThreadsScale, " with OMP_WAIT_POLICY=passive)");
    return scale;
  }
  return omp_wait_policy != nullptr && is_passive(omp_wait_policy) ? kSleepingThreadsScale : 1;
}

std::string describe_parallel_work_scale() {
  const std::int64_t scale = host_parallel_work_scale();
  if (scale == 1) return {};
  const char* forced = std::getenv("FERRY_PARALLEL_SCALE");
  if (forced != nullptr && *forced != '\0')
    return detail::concat("loops below ", scale, "x the usual work stay on one thread (FERRY_PARALLEL_SCALE=", scale, ")");
  return detail::concat("OpenMP threads sleep between loops (OMP_WAIT_POLICY=passive): loops below ", scale,
                        "x the usual work stay on one thread");
}

}  // namespace ferry::cpu

namespace ferry {

std::int64_t host_parallel_work_scale() {
  static const std::int64_t scale =
      cpu::parallel_work_scale_for(std::getenv("OMP_WAIT_POLICY"), std::getenv("FERRY_PARALLEL_SCALE"));
  return scale;
}

}  // namespace ferry
