// parallel_cost.cpp — the factor on the host loops' work thresholds (parallel_cost.h).
#include "parallel_cost.h"

#include <atomic>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "ferry/backend.h"
#include "ferry/error.h"

namespace ferry::cpu {

namespace {

std::atomic<std::int64_t> g_scale{0};       // 0: not read from the environment yet
std::atomic<bool> g_set_by_program{false};  // set_host_parallel_work_scale was called

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
    FERRY_CHECK(error == std::errc{} && stop == text.data() + text.size() && scale >= 1 &&
                    scale <= kMaxParallelWorkScale,
                InvalidArgument, "FERRY_PARALLEL_SCALE='", detail::printable(text),
                "': expected a whole number from 1 to ", kMaxParallelWorkScale,
                " (the factor on the work a host loop needs before it splits over the threads), or unset (1; ",
                kSleepingThreadsScale, " with OMP_WAIT_POLICY=passive)");
    return scale;
  }
  return omp_wait_policy != nullptr && is_passive(omp_wait_policy) ? kSleepingThreadsScale : 1;
}

std::string describe_parallel_work_scale() {
  const std::int64_t scale = host_parallel_work_scale();
  if (scale == 1) return {};
  const std::string text = detail::concat("loops below ", scale, "x the usual work stay on one thread");
  if (g_set_by_program.load(std::memory_order_relaxed)) return text + " (set_host_parallel_work_scale)";
  const char* forced = std::getenv("FERRY_PARALLEL_SCALE");
  if (forced != nullptr && *forced != '\0') return text + " (FERRY_PARALLEL_SCALE=" + forced + ")";
  return "OpenMP threads sleep between loops (OMP_WAIT_POLICY=passive): " + text;
}

}  // namespace ferry::cpu

namespace ferry {

std::int64_t host_parallel_work_scale() {
  std::int64_t scale = cpu::g_scale.load(std::memory_order_relaxed);
  if (scale == 0) {
    scale = cpu::parallel_work_scale_for(std::getenv("OMP_WAIT_POLICY"), std::getenv("FERRY_PARALLEL_SCALE"));
    std::int64_t unread = 0;  // a setter that came first wins
    if (!cpu::g_scale.compare_exchange_strong(unread, scale, std::memory_order_relaxed)) scale = unread;
  }
  return scale;
}

void set_host_parallel_work_scale(std::int64_t scale) {
  FERRY_CHECK(scale >= 1 && scale <= cpu::kMaxParallelWorkScale, InvalidArgument, "set_host_parallel_work_scale(",
              scale, "): expected a factor from 1 to ", cpu::kMaxParallelWorkScale);
  cpu::g_set_by_program.store(true, std::memory_order_relaxed);
  cpu::g_scale.store(scale, std::memory_order_relaxed);
}

}  // namespace ferry
