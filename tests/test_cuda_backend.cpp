// test_cuda_backend.cpp — the cuda backend against the cpu: every kernel on large, strided, misaligned
// and every-dtype operands, copies through every path (pinned, pageable staging ring, non_blocking
// ordering), memory stats and out-of-memory, errors, and same-seed random numbers.
// Not here: the op-by-op parity suite over every device (test_core_ops.cpp, which includes cuda:0).
// Without a CUDA device every test that needs one skips, saying why.
#include <cmath>
#include <limits>
#include <cstdlib>
#include <optional>
#include <regex>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ferry/backend.h"
#include "ferry/nn/functional.h"
#include "ferry/profile.h"
#include "test_helpers.h"

#ifdef FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "../src/cuda/check.h"
#include "../src/cuda/cuda_backend.h"
#endif

namespace ferry {
namespace {

using testing::all_close;

const Device kCuda{DeviceType::CUDA, 0};

std::string no_device_reason() {
#ifdef FERRY_HAVE_CUDA
  return cuda::unavailable_reason();
#else
  return "cudaGetDeviceCount: not called, this build has no CUDA backend (FERRY_CUDA=OFF)";
#endif
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The kernel's view of a tensor (what the op layer hands a backend).
KernelTensor view_of(const Tensor& t) {
  KernelTensor k;
  k.data = t.data_ptr();
  k.dtype = t.dtype();
  k.ndim = t.dim();
  for (int d = 0; d < t.dim(); ++d) {
    k.shape[d] = t.shape()[d];
    k.strides[d] = t.strides()[d];
  }
  return k;
}

// Bytes of two host tensors are identical.
::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes()) return ::testing::AssertionFailure() << a.nbytes() << " vs " << b.nbytes() << " bytes";
  const Tensor x = a.contiguous(), y = b.contiguous();
  const auto* p = static_cast<const unsigned char*>(x.data_ptr());
  const auto* q = static_cast<const unsigned char*>(y.data_ptr());
  for (std::size_t i = 0; i < a.nbytes(); ++i) {
    if (p[i] != q[i]) return ::testing::AssertionFailure() << "byte " << i << ": " << int(p[i]) << " vs " << int(q[i]);
  }
  return ::testing::AssertionSuccess();
}

// Values times 4, truncated to whole numbers: many are equal, so a sort's stability shows.
Tensor floor_like_ties(const Tensor& t) { return mul(t, 4.0).to(DType::Int64).to(DType::Float32); }

// --- without a device: these always run ------------------------------------------------------------

TEST(CudaBackendAvailability, DeviceCountIsAnAnswerNeverAnError) {
  const int count = device_count(DeviceType::CUDA);
  EXPECT_GE(count, 0);
  EXPECT_EQ(is_available(DeviceType::CUDA), count > 0);
  if (count == 0) {
    EXPECT_FALSE(no_device_reason().empty());
    EXPECT_EQ(Device::parse("auto"), kCPU);
    try {
      Device::parse("cuda");
      ADD_FAILURE() << "cuda parsed on a machine without one";
    } catch (const DeviceUnavailable& e) {
      EXPECT_TRUE(contains(e.what(), "Devices present: cpu")) << e.what();
    }
    EXPECT_EQ(device_count(DeviceType::CUDA), 0);  // asked again: the same answer, still no exception
#ifdef FERRY_HAVE_CUDA
    EXPECT_TRUE(contains(no_device_reason(), "cudaGetDeviceCount")) << no_device_reason();
#endif
  }
}

#ifdef FERRY_HAVE_CUDA
TEST(CudaBackendAvailability, CheckMacrosNameTheCallFileLineAndDevice) {
  try {
    FERRY_CUDA_CHECK(cudaErrorInvalidValue);
    ADD_FAILURE() << "no throw";
  } catch (const BackendError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "CUDA error cudaErrorInvalidValue")) << message;
    EXPECT_TRUE(contains(message, "tests/test_cuda_backend.cpp:")) << message;
    EXPECT_TRUE(contains(message, " on cuda:") || contains(message, " on no CUDA device")) << message;
  }
  try {
    FERRY_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
    ADD_FAILURE() << "no throw";
  } catch (const BackendError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "cuBLAS error CUBLAS_STATUS_NOT_INITIALIZED (")) << message;
    EXPECT_TRUE(contains(message, ") in CUBLAS_STATUS_NOT_INITIALIZED at tests/test_cuda_backend.cpp:")) << message;
  }
}
#endif

// --- with a device ----------------------------------------------------------------------------------

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device_count(DeviceType::CUDA) == 0) GTEST_SKIP() << "no CUDA device (" << no_device_reason() << ")";
  }

  // op on cpu inputs and on their cuda copies; the cuda result, moved back, is close to the cpu's.
  static void expect_matches_cpu(const std::string& name, const std::vector<Tensor>& cpu_inputs,
                                 const std::function<Tensor(const std::vector<Tensor>&)>& op, double rtol = 1e-5,
                                 double atol = 1e-6) {
    std::vector<Tensor> cuda_inputs;
    for (const Tensor& t : cpu_inputs) cuda_inputs.push_back(t.to(kCuda));
    const Tensor expected = op(cpu_inputs);
    const Tensor got = op(cuda_inputs);
    ASSERT_EQ(got.device(), kCuda) << name;
    EXPECT_TRUE(all_close(got.cpu(), expected, rtol, atol)) << name;
  }
};

TEST_F(CudaBackend, PropertiesDescribeTheCard) {
  const DeviceProperties p = backend(kCuda).properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GE(p.cores, p.multiprocessors * 64);
  EXPECT_GT(p.clock_hz, 1e8);
  EXPECT_GT(p.memory_bytes, std::int64_t{1} << 30);
  EXPECT_GT(p.memory_bytes_per_second, 1e11);
  EXPECT_TRUE(contains(p.link, "PCIe")) << p.link;
  EXPECT_TRUE(contains(p.libraries, "cuBLAS ")) << p.libraries;
#ifdef FERRY_HAVE_CUDNN
  const char* off = std::getenv("FERRY_CUDNN");
  if (off == nullptr || std::string(off) != "0") {
    EXPECT_TRUE(contains(p.libraries, "(conv2d, batch_norm)")) << p.libraries;
  }
#endif
}

TEST_F(CudaBackend, StreamsAreSeparateAndNonBlocking) {
  Backend& be = backend(kCuda);
  const Stream compute = be.compute_stream(0), copy = be.copy_stream(0);
  EXPECT_NE(compute.handle, nullptr);
  EXPECT_NE(copy.handle, nullptr);
  EXPECT_NE(compute.handle, copy.handle);
  EXPECT_EQ(compute.device, kCuda);
  be.stream_wait(copy, compute);
  be.stream_wait(compute, copy);
  be.synchronize(copy);
  be.synchronize_device(0);
}

TEST_F(CudaBackend, OutOfMemoryNamesTheNumbersAndTheProcessCarriesOn) {
  const MemoryStats before = backend(kCuda).memory_stats(0);
  ASSERT_GT(before.total, 0);
  // Far more than the card has: refused before CUDA is asked.
  const std::int64_t huge = before.total * 2;
  try {
    empty({huge}, {.device = kCuda, .dtype = DType::UInt8});
    ADD_FAILURE() << "allocated " << huge << " bytes";
  } catch (const OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "cuda:0")) << message;
    EXPECT_TRUE(contains(message, std::to_string(huge) + " bytes")) << message;
    for (const char* word : {"allocated", "reserved", "free", "total"}) EXPECT_TRUE(contains(message, word)) << message;
  }
  // Less than the card, more than is free: refused by the stream-ordered allocator itself.
  const std::int64_t most = static_cast<std::int64_t>(static_cast<double>(before.free) * 0.6);
  {
    Tensor first = empty({most}, {.device = kCuda, .dtype = DType::UInt8});
    EXPECT_THROW(empty({most}, {.device = kCuda, .dtype = DType::UInt8}), OutOfMemory);
  }
  backend(kCuda).empty_cache(0);
  // ... and the process computes correctly afterwards.
  manual_seed(3);
  const Tensor x = randn({1000, 100});
  expect_matches_cpu("after OOM", {x}, [](const std::vector<Tensor>& v) { return sum(mul(v[0], 2.0), {1}); });
  EXPECT_EQ(backend(kCuda).memory_stats(0).allocated, before.allocated);
}

TEST_F(CudaBackend, MemoryStatsTrackAllocatedPeakAndReserved) {
  Backend& be = backend(kCuda);
  be.reset_peak_memory_stats(0);
  const MemoryStats before = be.memory_stats(0);
  constexpr std::int64_t kBytes = std::int64_t{4} << 20;
  MemoryStats during;
  {
    Tensor t = empty({kBytes / 4}, {.device = kCuda});
    during = be.memory_stats(0);
    EXPECT_EQ(during.allocated, before.allocated + kBytes);
    EXPECT_GE(during.peak, during.allocated);
    EXPECT_GE(during.reserved, during.allocated);
    EXPECT_EQ(during.allocations, before.allocations + 1);
    EXPECT_GT(during.free, 0);
    EXPECT_GT(during.total, during.free);
  }
  const MemoryStats after = be.memory_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak, before.allocated + kBytes);
  be.empty_cache(0);
  EXPECT_LE(be.memory_stats(0).reserved, after.reserved);
  be.reset_peak_memory_stats(0);
  EXPECT_EQ(be.memory_stats(0).peak, be.memory_stats(0).allocated);
}

// Host->device copies into fresh tensors no longer wait for the compute stream (their memory is taken in
// the copy stream's order): while a long queue of kernels runs, batches copied in, used and freed again
// (their blocks reused by the next copies) must still arrive whole and be read only once they have.
TEST_F(CudaBackend, CopiesBesideQueuedComputeAreOrderedAndReuseMemorySafely) {
  manual_seed(6);
  const Tensor a = randn({2048, 2048}, {.device = kCuda});
  std::vector<Tensor> hosts;
  for (int i = 0; i < 4; ++i) hosts.push_back(full({1 << 22}, static_cast<double>(i + 1)).pin_memory());
  const Tensor pageable = full({1 << 22}, 7.0);
  Tensor busy = a;
  Tensor total = zeros({}, {.device = kCuda, .dtype = DType::Float64});
  for (int round = 0; round < 24; ++round) {
    busy = matmul(busy, a).mul_(1e-3);  // keeps the compute stream busy while the next copy is queued
    const Tensor batch = round % 5 == 4 ? pageable.to(kCuda) : hosts[round % 4].to(kCuda, /*non_blocking=*/true);
    total = add(total, sum(batch.to(DType::Float64)));
  }  // each batch is freed on the compute stream and its block reused by a later copy
  double expected = 0;
  for (int round = 0; round < 24; ++round) expected += (round % 5 == 4 ? 7.0 : (round % 4) + 1.0) * (1 << 22);
  EXPECT_EQ(total.item<double>(), expected);
  EXPECT_TRUE(std::isfinite(sum(busy).item<double>()));
}

TEST_F(CudaBackend, PinnedNonBlockingCopiesKeepStreamOrder) {
  manual_seed(5);
  const Tensor host = randn({1 << 24}).pin_memory();  // 64 MB, page-locked
  ASSERT_TRUE(host.is_pinned());
  const Tensor device = host.to(kCuda, /*non_blocking=*/true);
  const Tensor doubled = mul(device, 2.0);  // a kernel right behind the async copy
  const Tensor back = doubled.to(kCPU, /*non_blocking=*/true);
  EXPECT_TRUE(back.is_pinned());
  synchronize(kCuda);
  EXPECT_TRUE(same_bytes(back, mul(host, 2.0)));

  // A write after a non_blocking read of the same memory waits for the read.
  Tensor source = full({1 << 22}, 1.0, {.device = kCuda});
  const Tensor snapshot = source.to(kCPU, /*non_blocking=*/true);
  source.fill_(5.0);
  synchronize(kCuda);
  EXPECT_TRUE(same_bytes(snapshot, full({1 << 22}, 1.0)));
  EXPECT_EQ(source.select(0, 0).item<float>(), 5.0f);
}

TEST_F(CudaBackend, PageableCopiesAreExactOnEveryPath) {
  // below, at and above the staging threshold (4 MB), chunk-sized and ragged
  for (const std::int64_t bytes : {std::int64_t{1000}, (std::int64_t{4} << 20) - 1, std::int64_t{4} << 20,
                                   (std::int64_t{5} << 20) + 3, (std::int64_t{33} << 20) + 17, std::int64_t{64} << 20}) {
    manual_seed(static_cast<std::uint64_t>(bytes));
    const Tensor host = randint(0, 256, {bytes}, {.dtype = DType::UInt8});
    const Tensor device = host.to(kCuda);
    EXPECT_TRUE(same_bytes(device.cpu(), host)) << bytes << " bytes, blocking";
    Tensor async_device;
    {
      const Tensor temporary = host.clone();
      async_device = temporary.to(kCuda, /*non_blocking=*/true);  // the source dies right after the call
    }
    EXPECT_TRUE(same_bytes(async_device.cpu(), host)) << bytes << " bytes, non_blocking";
  }
  // a source 3 bytes past any alignment: the staging threads' streaming stores load it unaligned
  const std::int64_t ragged = (std::int64_t{9} << 20) + 5;
  const Tensor padded = randint(0, 256, {ragged + 3}, {.dtype = DType::UInt8});
  const Tensor offset_source = padded.narrow(0, 3, ragged);
  EXPECT_TRUE(same_bytes(offset_source.to(kCuda).cpu(), offset_source.clone())) << "source at byte offset 3";
  // many copies in a row reuse the ring's buffers in order
  manual_seed(9);
  const Tensor a = randn({3 << 20}), b = randn({5 << 20});
  std::vector<Tensor> on_device;
  for (int i = 0; i < 6; ++i) on_device.push_back((i % 2 ? b : a).to(kCuda, /*non_blocking=*/true));
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(same_bytes(on_device[static_cast<std::size_t>(i)].cpu(), i % 2 ? b : a)) << i;
}

// The staging ring times up to six ways to copy (all its threads or half of them; streaming stores in 4 MB chunks,
// memcpy in 4 MB chunks or in 1 MB chunks) on its first copies of 64 MB or more in each direction, each way twice,
// and keeps the fastest (src/cuda/copy.cpp); every copy is exact whichever way it went, also when the next copy lays
// the ring's buffers out for another chunk size.
TEST_F(CudaBackend, StagingRingChoosesItsWayAfterItsFirstLargeCopiesEachWay) {
#ifdef FERRY_HAVE_CUDA
  if (std::getenv("FERRY_STAGING_STREAMING") != nullptr) GTEST_SKIP() << "FERRY_STAGING_STREAMING forces the stores";
  EXPECT_EQ(cuda::staging_choice(true), "not chosen yet");
  EXPECT_EQ(cuda::staging_choice(false), "not chosen yet");
  manual_seed(17);
  const Tensor host = randint(0, 256, {(std::int64_t{64} << 20) + 5}, {.dtype = DType::UInt8});
  if (device_count(DeviceType::CUDA) > 1) {  // card-to-card copies go peer to peer, never through the ring
    const Tensor on_first = host.to(kCuda);
    std::vector<Tensor> on_second;
    for (int i = 0; i < 8; ++i) on_second.push_back(on_first.to(Device{DeviceType::CUDA, 1}));
    EXPECT_EQ(cuda::staging_choice(false), "not chosen yet") << "a card-to-card copy was staged through the host";
    EXPECT_TRUE(same_bytes(on_second.back().cpu(), host));
  }
  // Before each large copy, a smaller one (4 MB chunks, the default way) whose last DMAs may still be queued when
  // the large copy lays the ring out for 1 MB chunks, over the same pinned bytes.
  const Tensor smaller = randint(0, 256, {std::int64_t{16} << 20}, {.dtype = DType::UInt8});
  std::vector<Tensor> queued;
  // A trial waits for its copy's last DMAs. For the second large copy, non-blocking, that wait is the host's only
  // one: the ledger records it as a sync of its own, once (a blocking copy's trial is its copy's own wait).
  const auto trial_syncs = [] {
    std::size_t n = 0;
    for (const SyncRecord& sync : Ledger::global().syncs()) n += sync.reason.starts_with("staging ring trial");
    return n;
  };
  for (int i = 0; i < 12; ++i) {  // six ways at most, twice each
    queued.push_back(smaller.to(kCuda, /*non_blocking=*/true));
    const bool trying = cuda::staging_choice(true) == "not chosen yet";
    const std::size_t syncs_before = trial_syncs();
    const Tensor device = host.to(kCuda, /*non_blocking=*/i == 1);
    EXPECT_EQ(trial_syncs() - syncs_before, i == 1 && trying ? 1U : 0U) << "copy " << i << (trying ? ", a trial" : "");
    EXPECT_TRUE(same_bytes(device.cpu(), host)) << "copy " << i;
    if (i == 0) {
      EXPECT_EQ(cuda::staging_choice(true), "not chosen yet") << "chosen after one copy, with two stores to try";
    }
  }
  for (std::size_t i = 0; i < queued.size(); ++i) EXPECT_TRUE(same_bytes(queued[i].cpu(), smaller)) << "smaller copy " << i;
  const std::string threads = std::getenv("FERRY_STAGING_THREADS") ? R"( threads? \(forced\))" : " threads?";
  const std::string chunks = std::getenv("FERRY_STAGING_CHUNK_MB") ? R"( MiB chunks \(forced\))" : " MiB chunks";
  for (const bool to_device : {true, false}) {
    const std::string choice = cuda::staging_choice(to_device);
    EXPECT_TRUE(std::regex_match(choice, std::regex("(streaming stores|memcpy), [0-9]+" + threads + ", [124]" + chunks)))
        << (to_device ? "host->device: " : "device->host: ") << choice;
  }
  // Where the staging threads' time went is summed over the copies of 64 MiB or more made with the kept way: not the
  // trials, not the smaller copies.
  const Backend& cuda = backend(DeviceType::CUDA);
  const std::size_t before_up = cuda.pageable_copy_path(true).timed_copies;
  const std::size_t before_down = cuda.pageable_copy_path(false).timed_copies;
  if (!std::getenv("FERRY_STAGING_THREADS") && !std::getenv("FERRY_STAGING_CHUNK_MB")) {  // twelve trials each way
    const std::size_t after_trials = device_count(DeviceType::CUDA) > 1 ? 1 : 0;  // the card-to-card part's copies
    EXPECT_EQ(before_up, after_trials) << "host->device: the trials were counted, or a copy with the kept way was not";
    EXPECT_EQ(before_down, after_trials) << "device->host: the trials were counted, or a copy with the kept way was not";
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(same_bytes(host.to(kCuda).cpu(), host)) << "copy with the kept way " << i;
  EXPECT_TRUE(same_bytes(smaller.to(kCuda).cpu(), smaller));
  for (const bool to_device : {true, false}) {
    const PageableCopyPath path = cuda.pageable_copy_path(to_device);
    const char* direction = to_device ? "host->device" : "device->host";
    EXPECT_EQ(path.timed_copies, (to_device ? before_up : before_down) + 2) << direction;
    EXPECT_GT(path.copying_share, 0.0) << direction;
    EXPECT_GE(path.waiting_share, 0.0) << direction;
    EXPECT_LE(path.copying_share + path.waiting_share, 1.0 + 1e-9) << direction << ": more than the threads' time";
    EXPECT_GT(path.copying_rate, 0.0) << direction;
  }
#endif
}

// measure_link (ferry bench link) copies a pageable size the ring chooses with until the ring has chosen, so that
// its median is of the way kept, not of the ways tried in turn; smaller sizes leave the choice open. The backend
// says which way was kept, for people.
TEST_F(CudaBackend, LinkMeasureTimesThePageableWayTheRingKeeps) {
  const Backend& cuda = backend(DeviceType::CUDA);
  const bool one_way =
      std::getenv("FERRY_STAGING_STREAMING") && std::getenv("FERRY_STAGING_THREADS") && std::getenv("FERRY_STAGING_CHUNK_MB");
  EXPECT_EQ(cuda.pageable_copy_path(true).settled, one_way) << "settled before any copy";
  EXPECT_EQ(cuda.pageable_copy_path(true).tuning_bytes, std::size_t{64} << 20);
  MeasureOptions options;
  options.repeats = 1;
  options.sizes = {16e6};
  measure_link(kCuda, LinkPath::HostToDevicePageable, options);
  EXPECT_EQ(cuda.pageable_copy_path(true).settled, one_way) << "16 MB copies took part in the choice";
  std::vector<std::string> progress;
  options.progress = [&](const std::string& line) { progress.push_back(line); };
  options.sizes = {static_cast<double>(std::int64_t{64} << 20)};
  measure_link(kCuda, LinkPath::HostToDevicePageable, options);
  const PageableCopyPath up = cuda.pageable_copy_path(true);
  EXPECT_TRUE(up.settled);
  EXPECT_TRUE(std::regex_match(up.description, std::regex("copies of 4 MiB or more go through the pinned staging "
                                                          "ring, with (streaming stores|memcpy).*, [0-9]+ threads?.*")))
      << up.description;
  if (!one_way) {
    EXPECT_EQ(progress.size(), 2u) << "a line for the choice, a line for the size";
    EXPECT_TRUE(!progress.empty() && progress.front() == "link cuda:0 host->device: " + up.description)
        << (progress.empty() ? "no progress" : progress.front());
  }
  EXPECT_EQ(cuda.pageable_copy_path(false).settled, one_way) << "device->host chooses on its own copies";
}

TEST_F(CudaBackend, DeviceToDeviceCopies) {
  manual_seed(11);
  const Tensor x = randn({1 << 20, 3}).to(kCuda);
  EXPECT_TRUE(same_bytes(x.clone().cpu(), x.cpu()));
  EXPECT_TRUE(same_bytes(x.t().contiguous().t().contiguous().cpu(), x.cpu()));
  if (device_count(DeviceType::CUDA) > 1) {
    const Device other{DeviceType::CUDA, 1};
    const Tensor there = x.to(other, /*non_blocking=*/true);
    EXPECT_EQ(there.device(), other);
    EXPECT_TRUE(same_bytes(there.cpu(), x.cpu()));
    EXPECT_TRUE(same_bytes(there.to(kCuda).cpu(), x.cpu()));
  }
}

TEST_F(CudaBackend, ElementwiseMatchesCpuOnLargeStridedAndMisalignedOperands) {
  manual_seed(13);
  const Tensor a = randn({1027, 1031}), b = randn({1027, 1031}), row = randn({1031}), s = randn({});
  using V = const std::vector<Tensor>&;
  const std::vector<std::pair<std::string, std::function<Tensor(V)>>> cases = {
      {"add", [](V x) { return add(x[0], x[1]); }},
      {"add_alpha", [](V x) { return add(x[0], x[1], -0.5); }},
      {"sub_broadcast_row", [](V x) { return sub(x[0], x[2]); }},
      {"mul_scalar_tensor", [](V x) { return mul(x[0], x[3]); }},
      {"div_transposed", [](V x) { return div(x[0].t(), add(abs(x[1]), 0.5).t()); }},
      {"maximum_strided_rows", [](V x) { return maximum(x[0].narrow(1, 1, 1029), x[1].narrow(1, 2, 1029)); }},
      {"add_misaligned", [](V x) {
         const std::int64_t n = x[0].numel() - 2;
         return add(x[0].flatten().narrow(0, 1, n), x[1].flatten().narrow(0, 2, n));
       }},
      {"minimum_nan", [](V x) { return minimum(x[0], log(x[1])); }},
      {"pow", [](V x) { return pow(add(abs(x[0]), 0.1), x[1]); }},
      {"exp_log_sqrt", [](V x) { return add(exp(x[0]), sqrt(log(add(abs(x[1]), 1.0)))); }},
      {"unary_chain", [](V x) { return tanh(sigmoid(relu(neg(square(x[0]))) + rsqrt(add(abs(x[1]), 0.1)))); }},
      {"sign_abs", [](V x) { return mul(sign(x[0]), abs(x[1])); }},
      {"comparisons", [](V x) { return where(logical_not(le(x[0], x[1])), x[0], x[2]); }},
      {"scalar_ops", [](V x) { return rdiv(add(abs(x[0]), 1.0), 3.0) - (2.0 - x[1]) * 0.25; }},
      {"where_broadcast", [](V x) { return where(gt(x[2], 0.0), x[0], x[3]); }},
      {"to_float64_and_back", [](V x) { return add(x[0].to(DType::Float64), 1e-9).to(DType::Float32); }},
      {"eight_dims", [](V x) {
         Tensor y = x[0].narrow(0, 0, 1024).narrow(1, 0, 1024).reshape({8, 8, 8, 8, 4, 4, 4, 4});
         return add(y.permute({7, 6, 5, 4, 3, 2, 1, 0}), y.permute({7, 6, 5, 4, 3, 2, 1, 0}).contiguous());
       }},
  };
  for (const auto& [name, op] : cases) expect_matches_cpu(name, {a, b, row, s}, op);
  // in place, on a strided view
  Tensor host = a.clone(), device = a.to(kCuda);
  host.t().narrow(0, 3, 100).mul_(3.0);
  device.t().narrow(0, 3, 100).mul_(3.0);
  host.narrow(1, 5, 7).fill_(-0.0);
  device.narrow(1, 5, 7).fill_(-0.0);
  EXPECT_TRUE(same_bytes(device.cpu(), host));
}

TEST_F(CudaBackend, ElementwiseMatchesCpuForEveryDtype) {
  manual_seed(17);
  const Tensor ints = randint(-50, 50, {4097});  // 17 x 241
  const Tensor other = randint(-50, 50, {4097});
  const Tensor naturals = randint(0, 100, {4097});  // float -> uint8 of a negative value is undefined in C++
  const std::vector<DType> dtypes = {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::UInt8,
                                     DType::Bool};
  using V = const std::vector<Tensor>&;
  for (DType dtype : dtypes) {
    const Tensor x = ints.to(dtype), y = other.to(dtype);
    const std::string name(dtype_name(dtype));
    expect_matches_cpu(name + " add", {x, y}, [](V v) { return add(v[0], v[1]); }, 0, 0);
    expect_matches_cpu(name + " mul", {x, y}, [](V v) { return mul(v[0], v[1]); }, 0, 0);
    expect_matches_cpu(name + " maximum", {x, y}, [](V v) { return maximum(v[0], v[1]); }, 0, 0);
    expect_matches_cpu(name + " lt", {x, y}, [](V v) { return lt(v[0], v[1]).to(DType::UInt8); }, 0, 0);
    expect_matches_cpu(name + " eq scalar", {x}, [](V v) { return eq(v[0], 1.0).to(DType::UInt8); }, 0, 0);
    expect_matches_cpu(name + " where", {x, y}, [](V v) { return where(gt(v[0], v[1]), v[0], v[1]); }, 0, 0);
    expect_matches_cpu(name + " logical_not", {x}, [](V v) { return logical_not(v[0]).to(DType::UInt8); }, 0, 0);
    expect_matches_cpu(name + " sum", {x}, [](V v) { return sum(v[0]); }, 0, 0);
    expect_matches_cpu(name + " max dim", {x}, [](V v) { return max(v[0].reshape({17, 241}), 1).second; }, 0, 0);
    if (dtype != DType::Bool) {
      expect_matches_cpu(name + " sub", {x, y}, [](V v) { return sub(v[0], v[1]); }, 0, 0);
      expect_matches_cpu(name + " abs", {x}, [](V v) { return abs(v[0]); }, 0, 0);
      expect_matches_cpu(name + " times 3", {x}, [](V v) { return mul(v[0], 3.0); }, 0, 0);
      expect_matches_cpu(name + " div", {x, y}, [](V v) { return div(v[0], v[1]); }, 1e-6, 1e-6);
    }
    const Tensor n = naturals.to(dtype);
    for (DType target : dtypes) {
      expect_matches_cpu(name + " to " + std::string(dtype_name(target)), {n},
                         [target](V v) { return v[0].to(target).to(DType::Float64); }, 0, 0);
      expect_matches_cpu(name + " strided to " + std::string(dtype_name(target)), {n},
                         [target](V v) { return v[0].reshape({17, 241}).t().to(target).to(DType::Float64); }, 0, 0);
    }
  }
  // Floating values no integer holds: NaN, infinities, beyond int64, negatives into uint8. The GPU's own
  // conversion would give 0 for NaN and clamp the rest; ferry's gives the cpu's numbers.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special = {std::nan(""), inf, -inf, 1e30, -1e30, -1.5, 300.7, 2.5, -0.0, 65535.9};
  for (DType from : {DType::Float32, DType::Float64}) {
    const Tensor x = from_vector(special).to(from);
    for (DType target : {DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
      expect_matches_cpu(std::string(dtype_name(from)) + " special values to " + std::string(dtype_name(target)), {x},
                         [target](V v) { return v[0].to(target).to(DType::Float64); }, 0, 0);
    }
  }
}

TEST_F(CudaBackend, ReductionsMatchCpu) {
  manual_seed(19);
  using V = const std::vector<Tensor>&;
  const Tensor long_row = randn({(1 << 22) + 5});
  expect_matches_cpu("sum all", {long_row}, [](V v) { return sum(v[0]); });
  expect_matches_cpu("mean all", {long_row}, [](V v) { return mean(v[0]); });
  expect_matches_cpu("max all", {long_row}, [](V v) { return max(v[0]); }, 0, 0);
  expect_matches_cpu("argmin all", {long_row}, [](V v) { return argmin(v[0].reshape({1, -1}), 1); }, 0, 0);
  const Tensor rows = randn({37, 100003});
  expect_matches_cpu("sum rows", {rows}, [](V v) { return sum(v[0], {1}); });
  expect_matches_cpu("sum columns", {rows}, [](V v) { return sum(v[0], {0}); });
  expect_matches_cpu("var", {rows}, [](V v) { return var(v[0], {1}); }, 1e-4, 1e-5);
  const Tensor cube = randn({3, 50000, 5});
  expect_matches_cpu("mean middle", {cube}, [](V v) { return mean(v[0], {1}); });
  expect_matches_cpu("max middle", {cube}, [](V v) { return max(v[0], 1).first; }, 0, 0);
  expect_matches_cpu("argmax middle", {cube}, [](V v) { return argmax(v[0], 1); }, 0, 0);
  expect_matches_cpu("sum outer and inner", {cube}, [](V v) { return sum(v[0], {0, 2}, true); });
  // ties go to the first index, NaN wins and the first NaN is the one reported
  const Tensor ties = randint(0, 3, {64, 999}).to(DType::Float32);
  expect_matches_cpu("argmax ties", {ties}, [](V v) { return argmax(v[0], 1); }, 0, 0);
  expect_matches_cpu("argmin ties columns", {ties}, [](V v) { return argmin(v[0], 0); }, 0, 0);
  Tensor with_nan = randn({8, 5000});
  with_nan.narrow(1, 1234, 1).fill_(NAN);
  with_nan.narrow(1, 4321, 1).fill_(NAN);
  expect_matches_cpu("max nan", {with_nan}, [](V v) { return max(v[0], 1).first; }, 0, 0);
  expect_matches_cpu("argmax nan", {with_nan}, [](V v) { return argmax(v[0], 1); }, 0, 0);
  expect_matches_cpu("argmin nan columns", {with_nan.t().contiguous()}, [](V v) { return argmin(v[0], 0); }, 0, 0);
  // integers sum exactly; empty dims
  const Tensor counts = randint(0, 1000, {1 << 20});
  expect_matches_cpu("int64 sum", {counts}, [](V v) { return sum(v[0]); }, 0, 0);
  const Tensor empty_dim = zeros({4, 0, 3});
  expect_matches_cpu("sum empty", {empty_dim}, [](V v) { return sum(v[0], {1}); }, 0, 0);
  expect_matches_cpu("mean empty", {empty_dim}, [](V v) { return mean(v[0], {1}); }, 0, 0);
}

TEST_F(CudaBackend, MatmulMatchesCpu) {
  manual_seed(23);
  using V = const std::vector<Tensor>&;
  const Tensor a = randn({257, 129}), b = randn({129, 65}), bt = randn({65, 129}), at = randn({129, 257});
  expect_matches_cpu("mm", {a, b}, [](V v) { return matmul(v[0], v[1]); }, 1e-4, 1e-4);
  expect_matches_cpu("mm transposed b", {a, bt}, [](V v) { return matmul(v[0], v[1].t()); }, 1e-4, 1e-4);
  expect_matches_cpu("mm transposed a", {at, b}, [](V v) { return matmul(v[0].t(), v[1]); }, 1e-4, 1e-4);
  expect_matches_cpu("mm both transposed", {at, bt}, [](V v) { return matmul(v[0].t(), v[1].t()); }, 1e-4, 1e-4);
  expect_matches_cpu("mm vector", {a, b}, [](V v) { return matmul(v[0], v[1].select(1, 3)); }, 1e-4, 1e-4);
  const Tensor p = randn({6, 33, 17}), q = randn({6, 17, 9}), r = randn({2, 1, 33, 17});
  expect_matches_cpu("bmm", {p, q}, [](V v) { return bmm(v[0], v[1]); }, 1e-4, 1e-4);
  expect_matches_cpu("broadcast batches", {r, q}, [](V v) { return matmul(v[0], v[1]); }, 1e-4, 1e-4);
  expect_matches_cpu("float64", {a.to(DType::Float64), b.to(DType::Float64)},
                     [](V v) { return matmul(v[0], v[1]); }, 1e-12, 1e-12);
#ifdef FERRY_HAVE_CUDA
  cuda::set_allow_tf32(true);
  expect_matches_cpu("tf32", {a, b}, [](V v) { return matmul(v[0], v[1]); }, 2e-2, 5e-2);
  cuda::set_allow_tf32(false);
  EXPECT_FALSE(cuda::allow_tf32());
#endif
}

TEST_F(CudaBackend, IndexSelectAndItsBackwardMatchCpu) {
  manual_seed(29);
  const Tensor table = randn({50, 33});
  // every index valid along both dims (50 rows, 33 columns), the last column included
  const Tensor index = from_vector<std::int64_t>({3, 3, 7, 0, 32, 3, 12});
  for (int dim : {0, 1}) {
    Tensor expected_grad, got_grad;
    for (Device d : {kCPU, kCuda}) {
      Tensor x = table.to(d).detach().requires_grad_(true);
      Tensor y = index_select(x, dim, index.to(d));
      sum(mul(y, y)).backward();
      (d.is_cpu() ? expected_grad : got_grad) = x.grad();
    }
    EXPECT_TRUE(all_close(got_grad.cpu(), expected_grad, 1e-5, 1e-6)) << "dim " << dim;
  }
  using V = const std::vector<Tensor>&;
  for (DType dtype : {DType::Int64, DType::UInt8, DType::Float64}) {
    expect_matches_cpu(std::string("index_select ") + std::string(dtype_name(dtype)), {table.to(dtype), index},
                       [](V v) { return index_select(v[0], 1, v[1]); }, 0, 0);
  }
}

// Large, every-dtype gathers and scatter-adds (the atomic path) and cumsums along each dim against the cpu.
TEST_F(CudaBackend, GatherScatterAddAndCumsumMatchCpu) {
  manual_seed(37);
  const Tensor table = randn({64, 300, 5});
  const Tensor index = randint(0, 64, {70, 300, 5}, {.dtype = DType::Int64});
  using V = const std::vector<Tensor>&;
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
    const Tensor values = dtype == DType::Bool ? gt(table, 0.0) : mul(table, 20.0).to(dtype);
    expect_matches_cpu(std::string("gather ") + std::string(dtype_name(dtype)), {values, index},
                       [](V v) { return gather(v[0], 0, v[1]); }, 0, 0);
    if (dtype == DType::Bool) continue;
    const double tolerance = is_floating(dtype) ? 1e-5 : 0;  // atomics add floats in another order
    expect_matches_cpu(std::string("scatter_add ") + std::string(dtype_name(dtype)),
                       {zeros({64, 300, 5}).to(dtype), index, values.narrow(0, 0, 64)},
                       [](V v) { return scatter_add(v[0], 0, v[1].narrow(0, 0, 64), v[2]); }, tolerance, tolerance);
    for (int dim : {0, 1, 2}) {
      expect_matches_cpu(std::string("cumsum ") + std::string(dtype_name(dtype)) + " dim " + std::to_string(dim),
                         {values}, [dim](V v) { return cumsum(v[0], dim); }, 0, 0);
    }
  }
}

// argsort's merge sort against the cpu's std::stable_sort: every dtype, with many ties (stability shows), rows of
// every length around the passes' powers of two, many short rows, and one long row.
TEST_F(CudaBackend, ArgsortMatchesCpuStableSort) {
  manual_seed(41);
  using V = const std::vector<Tensor>&;
  for (std::int64_t n : {1, 2, 3, 31, 32, 33, 255, 256, 257, 1000}) {
    const Tensor keys = floor_like_ties(randn({7, n}));
    for (bool descending : {false, true}) {
      for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::UInt8, DType::Bool}) {
        const Tensor values = dtype == DType::Bool ? gt(keys, 0.0) : keys.to(dtype);
        expect_matches_cpu(std::string("argsort n ") + std::to_string(n) + " " + std::string(dtype_name(dtype)) +
                               (descending ? " descending" : ""),
                           {values}, [descending](V v) { return argsort(v[0], 1, descending); }, 0, 0);
      }
    }
  }
  const Tensor with_nan = where(gt(randn({3, 500}), 1.0), full({}, std::nan("")), randn({3, 500}));
  expect_matches_cpu("argsort with NaN", {with_nan}, [](V v) { return argsort(v[0], 1); }, 0, 0);
  expect_matches_cpu("argsort with NaN, descending", {with_nan}, [](V v) { return argsort(v[0], 1, true); }, 0, 0);
  expect_matches_cpu("argsort of 5000 short rows", {randn({5000, 3})}, [](V v) { return argsort(v[0], 1); }, 0, 0);
  expect_matches_cpu("argsort of one long row", {floor_like_ties(randn({100000}))},
                     [](V v) { return argsort(v[0], 0); }, 0, 0);
  expect_matches_cpu("topk along dim 0", {randn({300, 20})}, [](V v) { return topk(v[0], 9, 0).first; }, 0, 0);
}

TEST_F(CudaBackend, BadIndexIsReportedAtTheNextSync) {
  const Tensor x = ones({5, 3}, {.device = kCuda});
  const Tensor index = from_vector<std::int64_t>({0, 7}, {.device = kCuda});
  const Tensor y = index_select(x, 0, index);  // enqueued; the kernel writes a report, not a fault
  try {
    synchronize(kCuda);
    ADD_FAILURE() << "no error reported";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "index 7 is out of bounds for dimension with size 5")) << e.what();
  }
  EXPECT_NO_THROW(synchronize(kCuda));  // reported once
  EXPECT_EQ(sum(x).item<float>(), 15.0f);
}

TEST_F(CudaBackend, CrossEntropyMatchesCpu) {
  manual_seed(31);
  for (const auto& [rows, classes] : std::vector<std::pair<std::int64_t, std::int64_t>>{{64, 10}, {3, 1000}, {5, 1}}) {
    const Tensor logits = mul(randn({rows, classes}), 4.0);
    const Tensor target = randint(0, classes, {rows});
    Tensor loss[2], grad[2];
    int slot = 0;
    for (Device d : {kCPU, kCuda}) {
      const Tensor l = logits.to(d), t = target.to(d);
      loss[slot] = empty({rows}, {.device = d});
      grad[slot] = empty({rows, classes}, {.device = d});
      backend(d).cross_entropy(view_of(loss[slot]), view_of(grad[slot]), view_of(l), view_of(t), 0.5,
                               backend(d).compute_stream(d.index));
      ++slot;
    }
    EXPECT_TRUE(all_close(loss[1].cpu(), loss[0], 1e-5, 1e-6)) << rows << "x" << classes;
    EXPECT_TRUE(all_close(grad[1].cpu(), grad[0], 1e-5, 1e-7)) << rows << "x" << classes;
  }
}

TEST_F(CudaBackend, Im2colCol2imAndPoolingMatchCpu) {
  manual_seed(37);
  Backend::Conv2dShape conv;
  conv.batch = 1;
  conv.in_channels = 3;
  conv.height = 9;
  conv.width = 11;
  conv.out_channels = 4;
  conv.kernel_h = 3;
  conv.kernel_w = 2;
  conv.stride_h = 2;
  conv.pad_h = 1;
  conv.pad_w = 1;
  conv.dilation_w = 2;
  const std::int64_t rows = conv.in_channels * conv.kernel_h * conv.kernel_w, cols = conv.out_h() * conv.out_w();
  const Tensor image = randn({conv.in_channels, conv.height, conv.width});
  const Tensor columns_in = randn({rows, cols});
  Tensor columns[2], images[2];
  Backend::Pool2dShape pool;
  pool.planes = 6;
  pool.height = 13;
  pool.width = 10;
  pool.kernel_h = 3;
  pool.kernel_w = 3;
  pool.stride_h = 2;
  pool.stride_w = 2;
  pool.pad_h = 1;
  pool.pad_w = 1;
  Tensor planes = randn({pool.planes, pool.height, pool.width});
  planes.select(0, 2).narrow(0, 4, 1).fill_(NAN);
  const Tensor grad_out = randn({pool.planes, pool.out_h(), pool.out_w()});
  Tensor max_out[2], argmax[2], max_grad[2], avg_out[2], avg_grad[2];
  int slot = 0;
  for (Device d : {kCPU, kCuda}) {
    Backend& be = backend(d);
    const Stream stream = be.compute_stream(d.index);
    const Tensor img = image.to(d), cin = columns_in.to(d), x = planes.to(d), g = grad_out.to(d);
    columns[slot] = empty({rows, cols}, {.device = d});
    images[slot] = empty({conv.in_channels, conv.height, conv.width}, {.device = d});
    be.im2col(view_of(columns[slot]), view_of(img), conv, stream);
    be.col2im(view_of(images[slot]), view_of(cin), conv, stream);
    max_out[slot] = empty({pool.planes, pool.out_h(), pool.out_w()}, {.device = d});
    argmax[slot] = empty({pool.planes, pool.out_h(), pool.out_w()}, {.device = d, .dtype = DType::Int64});
    max_grad[slot] = empty({pool.planes, pool.height, pool.width}, {.device = d});
    avg_out[slot] = empty({pool.planes, pool.out_h(), pool.out_w()}, {.device = d});
    avg_grad[slot] = empty({pool.planes, pool.height, pool.width}, {.device = d});
    be.max_pool2d(view_of(max_out[slot]), view_of(argmax[slot]), view_of(x), pool, stream);
    be.max_pool2d_backward(view_of(max_grad[slot]), view_of(g), view_of(argmax[slot]), pool, stream);
    be.avg_pool2d(view_of(avg_out[slot]), view_of(x), pool, stream);
    be.avg_pool2d_backward(view_of(avg_grad[slot]), view_of(g), pool, stream);
    ++slot;
  }
  // gathers in the cpu's order: the same bits
  EXPECT_TRUE(same_bytes(columns[1].cpu(), columns[0]));
  EXPECT_TRUE(same_bytes(images[1].cpu(), images[0]));
  EXPECT_TRUE(same_bytes(max_out[1].cpu(), max_out[0]));
  EXPECT_TRUE(same_bytes(argmax[1].cpu(), argmax[0]));
  EXPECT_TRUE(same_bytes(max_grad[1].cpu(), max_grad[0]));
  EXPECT_TRUE(all_close(avg_out[1].cpu(), avg_out[0], 1e-6, 1e-7));
  EXPECT_TRUE(all_close(avg_grad[1].cpu(), avg_grad[0], 1e-6, 1e-7));
}

TEST_F(CudaBackend, RandomNumbersAreTheCpusForTheSameSeed) {
  const auto draw = [](Device d, const std::function<Tensor(const TensorOptions&)>& make, DType dtype) {
    manual_seed(2024);
    return make({.device = d, .dtype = dtype}).cpu();
  };
  const Shape shape{1000003};
  for (DType dtype : {DType::Float32, DType::Float64}) {
    // The same Philox words on both devices. The last bit of a double may differ: low + (high - low) * u
    // is one fused multiply-add only where the cpu build contracts it, and Box-Muller's log/cos/sin
    // come from libm on one side and CUDA on the other.
    const auto uniform_draw = [&](const TensorOptions& o) { return uniform(shape, -2.0, 3.0, o); };
    EXPECT_TRUE(all_close(draw(kCuda, uniform_draw, dtype), draw(kCPU, uniform_draw, dtype), 1e-7, 1e-7));
    const auto normal_draw = [&](const TensorOptions& o) { return normal(shape, 1.0, 2.0, o); };
    const double tolerance = dtype == DType::Float32 ? 1e-6 : 1e-13;
    EXPECT_TRUE(all_close(draw(kCuda, normal_draw, dtype), draw(kCPU, normal_draw, dtype), tolerance, tolerance));
  }
  const auto unit_draw = [&](const TensorOptions& o) { return rand(shape, o); };  // low 0, high 1: exact
  EXPECT_TRUE(same_bytes(draw(kCuda, unit_draw, DType::Float32), draw(kCPU, unit_draw, DType::Float32)));
  const auto randint_draw = [&](const TensorOptions& o) { return randint(-7, 1000, shape, o); };
  EXPECT_TRUE(same_bytes(draw(kCuda, randint_draw, DType::Int64), draw(kCPU, randint_draw, DType::Int64)));
  // consecutive draws continue the same counter stream on both devices
  manual_seed(7);
  const Tensor cpu_first = randn({5}), cpu_second = randn({7});
  manual_seed(7);
  const Tensor cuda_first = randn({5}, {.device = kCuda}), cuda_second = randn({7}, {.device = kCuda});
  EXPECT_TRUE(all_close(cuda_first.cpu(), cpu_first, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(cuda_second.cpu(), cpu_second, 1e-6, 1e-6));
}

TEST_F(CudaBackend, ArangeAndFillMatchCpu) {
  using V = const std::vector<Tensor>&;
  for (DType dtype : {DType::Float32, DType::Float64}) {  // start + i * step: see RandomNumbers... on FMA
    EXPECT_TRUE(all_close(arange(0, 200, 0.7, {.device = kCuda, .dtype = dtype}).cpu(),
                          arange(0, 200, 0.7, {.dtype = dtype}), 1e-15, 1e-13))
        << dtype_name(dtype);
  }
  for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::UInt8}) {
    EXPECT_TRUE(same_bytes(arange(3, 200, 0.5, {.device = kCuda, .dtype = dtype}).cpu(),
                           arange(3, 200, 0.5, {.dtype = dtype})))
        << dtype_name(dtype);
    EXPECT_TRUE(same_bytes(full({1001}, 3.5, {.device = kCuda, .dtype = dtype}).cpu(), full({1001}, 3.5, {.dtype = dtype})));
  }
  EXPECT_TRUE(same_bytes(zeros({7, 9}, {.device = kCuda}).cpu(), zeros({7, 9})));
  expect_matches_cpu("fill strided", {zeros({64, 48})}, [](V v) {
    Tensor t = v[0].clone();
    t.t().narrow(0, 1, 5).fill_(2.5);
    return t;
  }, 0, 0);
}


// (C) values 0.5, 0.6, ... : distinct per channel, never zero.
Tensor linspace_like(std::int64_t channels) { return add(mul(arange(static_cast<double>(channels)), 0.1), 0.5); }

// --- cuDNN layers: the same results as the layers composed from ferry's kernels ----------------------

// One conv2d forward and backward on cuda; returns {out, grad input, grad weight, grad bias}, on the cpu.
std::vector<Tensor> conv_pass(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Tensor& probe,
                              nn::Size2 stride, nn::Size2 padding, nn::Size2 dilation, Device device = kCuda) {
  // detach(): on the cpu `to` returns the caller's tensor itself, which must not become a leaf that requires grad
  Tensor x = x_in.to(device).detach().requires_grad_(), w = w_in.to(device).detach().requires_grad_();
  Tensor b = b_in.to(device).detach().requires_grad_();
  const Tensor out = nn::functional::conv2d(x, w, b, stride, padding, dilation);
  sum(mul(out, probe.to(device))).backward();
  return {out.detach().cpu(), x.grad().cpu(), w.grad().cpu(), b.grad().cpu()};
}

// A cuDNN build uses cuDNN unless FERRY_CUDNN=0 says not to: then the comparisons below compare cuDNN with
// ferry's composed kernels, not the composed kernels with themselves (a refusal falls back without failing).
bool cudnn_expected() {
#ifdef FERRY_HAVE_CUDNN
  const char* off = std::getenv("FERRY_CUDNN");
  return off == nullptr || std::string(off) != "0";
#else
  return false;
#endif
}

TEST_F(CudaBackend, CudnnConvolutionMatchesTheComposedLayer) {
  struct Case { std::int64_t n, c, h, w, o, kh, kw; nn::Size2 stride, padding, dilation; };
  const std::vector<Case> cases = {
      {8, 16, 14, 14, 32, 3, 3, 1, 1, 1},           // the fmnist CNN's 'same' 3x3
      {4, 3, 17, 13, 8, 5, 3, {2, 1}, {2, 0}, 1},   // odd sizes, strides and padding
      {5, 6, 9, 11, 4, 3, 2, 2, 1, {1, 2}},         // dilation
      {6, 12, 7, 7, 10, 1, 1, 1, 0, 1},             // pointwise
  };
  manual_seed(41);
  for (const Case& c : cases) {
    const Tensor x = randn({c.n, c.c, c.h, c.w}), w = randn({c.o, c.c, c.kh, c.kw}), b = randn({c.o});
    const Tensor out_shape_probe = nn::functional::conv2d(x, w, b, c.stride, c.padding, c.dilation);
    const Tensor probe = randn(out_shape_probe.shape());
    const std::vector<Tensor> library = conv_pass(x, w, b, probe, c.stride, c.padding, c.dilation);
    nn::functional::set_library_layers(false);
    const std::vector<Tensor> composed = conv_pass(x, w, b, probe, c.stride, c.padding, c.dilation);
    nn::functional::set_library_layers(true);
    const char* names[] = {"out", "grad input", "grad weight", "grad bias"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(all_close(library[i], composed[i], 1e-4, 1e-4)) << names[i] << " of " << shape_str(x.shape()) << " * "
                                                                  << shape_str(w.shape());
    }
    EXPECT_TRUE(all_close(library[0], out_shape_probe, 1e-4, 1e-4)) << "cuda against cpu";
    if (cudnn_expected()) {
      Backend::Conv2dShape s;
      s.batch = c.n, s.in_channels = c.c, s.height = c.h, s.width = c.w, s.out_channels = c.o, s.kernel_h = c.kh;
      s.kernel_w = c.kw, s.stride_h = c.stride.h, s.stride_w = c.stride.w, s.pad_h = c.padding.h, s.pad_w = c.padding.w;
      s.dilation_h = c.dilation.h, s.dilation_w = c.dilation.w;
      EXPECT_TRUE(backend(kCuda).conv2d_library(s, DType::Float32, kCuda.index))
          << "cuDNN was built in but not used for " << shape_str(x.shape()) << " * " << shape_str(w.shape());
    }
  }
#ifdef FERRY_HAVE_CUDA
  // With TF32 allowed the search may pick tensor-op algorithms (a plan of their own, with their math type set
  // again before each call); the result is the fp32 one within TF32's rounding (10 mantissa bits).
  const Case& c = cases[0];
  const Tensor x = randn({c.n, c.c, c.h, c.w}), w = randn({c.o, c.c, c.kh, c.kw}), b = randn({c.o});
  const Tensor fp32 = nn::functional::conv2d(x, w, b, c.stride, c.padding, c.dilation);
  const Tensor probe = randn(fp32.shape());
  const std::vector<Tensor> exact = conv_pass(x, w, b, probe, c.stride, c.padding, c.dilation);
  cuda::set_allow_tf32(true);
  const std::vector<Tensor> tf32 = conv_pass(x, w, b, probe, c.stride, c.padding, c.dilation);
  // A second step: each direction sets its own math again (cuDNN may choose non-deterministic algorithms: 1e-4).
  const std::vector<Tensor> again = conv_pass(x, w, b, probe, c.stride, c.padding, c.dilation);
  cuda::set_allow_tf32(false);
  const char* names[] = {"out", "grad input", "grad weight", "grad bias"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(all_close(tf32[i], exact[i], 2e-2, 5e-2)) << names[i] << " with TF32 allowed";
    EXPECT_TRUE(all_close(again[i], tf32[i], 1e-4, 1e-4)) << names[i] << " with TF32 allowed, second pass";
  }
#endif
}

// conv_transpose2d runs its three directions on conv2d's cuDNN calls (forward = backward data, input gradient =
// forward, weight gradient = backward filter with the roles swapped): the same as composed, and as the cpu.
TEST_F(CudaBackend, CudnnTransposedConvolutionMatchesTheComposedLayer) {
  struct Case { std::int64_t n, c, h, w, o, kh, kw; nn::Size2 stride, padding, output_padding, dilation; };
  const std::vector<Case> cases = {
      {8, 32, 7, 7, 16, 4, 4, 2, 1, 0, 1},              // a decoder's 2x upsampling
      {4, 6, 5, 9, 3, 3, 2, {2, 1}, {1, 0}, {1, 0}, 1},  // odd sizes, strides, output padding
      {3, 4, 6, 5, 5, 3, 3, 1, 1, 1, 2},                 // output padding past the stride (dilation 2)
      {6, 12, 7, 7, 10, 1, 1, 1, 0, 0, 1},               // pointwise
  };
  manual_seed(43);
  for (const Case& c : cases) {
    const Tensor x = randn({c.n, c.c, c.h, c.w}), w = randn({c.c, c.o, c.kh, c.kw}), b = randn({c.o});
    auto pass = [&](const Tensor& probe, Device device) {
      Tensor xd = x.to(device).detach().requires_grad_(), wd = w.to(device).detach().requires_grad_();
      Tensor bd = b.to(device).detach().requires_grad_();
      const Tensor out =
          nn::functional::conv_transpose2d(xd, wd, bd, c.stride, c.padding, c.output_padding, 1, c.dilation);
      if (probe.defined()) sum(mul(out, probe.to(device))).backward();
      return std::vector<Tensor>{out.detach().cpu(), probe.defined() ? xd.grad().cpu() : Tensor(),
                                 probe.defined() ? wd.grad().cpu() : Tensor(), probe.defined() ? bd.grad().cpu() : Tensor()};
    };
    const Tensor probe = randn(pass(Tensor(), kCPU)[0].shape());
    const std::vector<Tensor> on_cpu = pass(probe, kCPU);
    const std::vector<Tensor> library = pass(probe, kCuda);
    nn::functional::set_library_layers(false);
    const std::vector<Tensor> composed = pass(probe, kCuda);
    nn::functional::set_library_layers(true);
    const char* names[] = {"out", "grad input", "grad weight", "grad bias"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(all_close(library[i], composed[i], 1e-4, 1e-4)) << names[i] << " of " << shape_str(x.shape());
      EXPECT_TRUE(all_close(library[i], on_cpu[i], 1e-4, 1e-4)) << names[i] << " of " << shape_str(x.shape())
                                                                << ": cuda against cpu";
    }
  }
}

// ferry/determinism.h: with deterministic algorithms a convolution's three directions repeat bit for bit
// (cuDNN's heuristics instead of its timed search, and only algorithms without atomics), and index_select's
// backward sums in the cpu's order, so it is the cpu's gradient bit for bit. The emulated cuDNN sums its
// non-deterministic algorithms in another order on every call, so there this also checks that they were passed
// over; on a real card it checks the cuDNN and the card ferry runs on.
TEST_F(CudaBackend, DeterministicAlgorithmsRepeatBitForBit) {
  const DeterministicAlgorithmsGuard deterministic(true);
  manual_seed(43);
  const Tensor x = randn({8, 16, 14, 14}), w = randn({32, 16, 3, 3}), b = randn({32}), probe = randn({8, 32, 14, 14});
  const std::vector<Tensor> first = conv_pass(x, w, b, probe, 1, 1, 1);
  const std::vector<Tensor> second = conv_pass(x, w, b, probe, 1, 1, 1);
  const std::vector<Tensor> on_cpu = conv_pass(x, w, b, probe, 1, 1, 1, kCPU);
  const char* names[] = {"out", "grad input", "grad weight", "grad bias"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(same_bytes(first[i], second[i])) << names[i];
    EXPECT_TRUE(all_close(first[i], on_cpu[i], 1e-4, 1e-4)) << names[i] << " against cpu";
  }
  // index_select's backward adds many rows into a few (index_add): the cpu's order, the cpu's bits.
  const Tensor table = randn({40, 33});
  std::vector<std::int64_t> rows;
  for (int k = 0; k < 300; ++k) rows.push_back((k * 7) % 5 == 0 ? 32 : (k * 13) % 6);
  const Tensor index = from_vector<std::int64_t>(rows);
  for (int dim : {0, 1}) {
    const Tensor weights = randn(index_select(table, dim, index).shape());  // distinct terms: their order matters
    Tensor grads[2];
    for (int i = 0; i < 2; ++i) {
      const Device d = i == 0 ? kCPU : kCuda;
      Tensor t = table.to(d).detach().requires_grad_(true);
      sum(mul(index_select(t, dim, index.to(d)), weights.to(d))).backward();
      grads[i] = t.grad().cpu();
    }
    EXPECT_TRUE(same_bytes(grads[1], grads[0])) << "index_select backward along dim " << dim;
  }
  // gather's backward (scatter_add) likewise, many elements into a few places; and cumsum, one order everywhere.
  std::vector<std::int64_t> picks;
  for (int k = 0; k < 40 * 200; ++k) picks.push_back((k * 7) % 3);
  const Tensor pick = from_vector<std::int64_t>(picks, {40, 200});
  const Tensor terms = randn({40, 200});
  Tensor gathered[2], sums[2];
  for (int i = 0; i < 2; ++i) {
    const Device d = i == 0 ? kCPU : kCuda;
    Tensor t = table.to(d).detach().requires_grad_(true);
    sum(mul(gather(t, 1, pick.to(d)), terms.to(d))).backward();
    gathered[i] = t.grad().cpu();
    sums[i] = cumsum(terms.to(d), 1).cpu();
  }
  EXPECT_TRUE(same_bytes(gathered[1], gathered[0])) << "gather backward";
  EXPECT_TRUE(same_bytes(sums[1], sums[0])) << "cumsum";
}

// BatchNorm in training on cuda: {out, grad input, grad weight, grad bias, running mean, running var}.
std::vector<Tensor> batch_norm_pass(const Tensor& x_in, const Tensor& probe, bool affine, std::optional<double> momentum,
                                    nn::functional::Activation activation = nn::functional::Activation::None) {
  Tensor x = x_in.to(kCuda).requires_grad_();
  const std::int64_t C = x_in.size(1);
  const DType dtype = x_in.dtype();
  Tensor weight, bias;
  if (affine) {
    weight = linspace_like(C).to(dtype).to(kCuda).requires_grad_();
    bias = mul(linspace_like(C), -0.5).to(dtype).to(kCuda).requires_grad_();
  }
  Tensor running_mean = full({C}, 0.25, {.device = kCuda, .dtype = dtype});
  Tensor running_var = full({C}, 2.0, {.device = kCuda, .dtype = dtype});
  const Tensor batches = full({}, 3, {.device = kCuda, .dtype = DType::Int64});
  const Tensor out =
      nn::functional::batch_norm(x, running_mean, running_var, weight, bias, true, momentum, 1e-5, batches, activation);
  sum(mul(out, probe.to(kCuda))).backward();
  return {out.detach().cpu(), x.grad().cpu(), affine ? weight.grad().cpu() : zeros({C}),
          affine ? bias.grad().cpu() : zeros({C}), running_mean.cpu(), running_var.cpu()};
}

TEST_F(CudaBackend, CudnnBatchNormMatchesTheComposedLayer) {
  manual_seed(43);
  for (const Shape& shape : {Shape{16, 8, 7, 7}, Shape{5, 3, 11}, Shape{64, 10}}) {
    for (const bool affine : {true, false}) {
      for (const std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
        const Tensor x = add(mul(randn(shape), 3.0), 1.5), probe = randn(shape);
        const std::vector<Tensor> library = batch_norm_pass(x, probe, affine, momentum);
        nn::functional::set_library_layers(false);
        const std::vector<Tensor> composed = batch_norm_pass(x, probe, affine, momentum);
        nn::functional::set_library_layers(true);
        const char* names[] = {"out", "grad input", "grad weight", "grad bias", "running mean", "running var"};
        for (int i = 0; i < 6; ++i) {
          EXPECT_TRUE(all_close(library[i], composed[i], 1e-4, 1e-4))
              << names[i] << " of " << shape_str(shape) << (affine ? " affine" : "") << " momentum "
              << (momentum ? std::to_string(*momentum) : "None");
        }
      }
    }
    if (cudnn_expected()) {  // still true after the runs: cuDNN did not refuse the layer and fall back
      std::int64_t inner = 1;
      for (std::size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
      EXPECT_TRUE(backend(kCuda).batch_norm_library({.batch = shape[0], .channels = shape[1], .inner = inner},
                                                    DType::Float32, kCuda.index))
          << "cuDNN was built in but not used for BatchNorm of " << shape_str(shape);
    }
  }
}

// The fused activations on cuda against the same layers on the cpu: Linear's bias + ReLU pass (AddRelu, float32,
// on a vectorisable and an odd width) and BatchNorm + ReLU on cuDNN and composed.
TEST_F(CudaBackend, FusedActivationsMatchCpu) {
  manual_seed(47);
  using V = const std::vector<Tensor>&;
  using nn::functional::Activation;
  for (const std::int64_t width : {1024, 37}) {
    const Tensor x = randn({129, 64}), w = mul(randn({width, 64}), 0.1), b = randn({width});
    expect_matches_cpu("linear relu " + std::to_string(width), {x, w, b},
                       [](V v) { return nn::functional::linear(v[0], v[1], v[2], Activation::ReLU); }, 1e-4, 1e-4);
  }
  // BatchNorm + ReLU: ferry's fused kernels (batch_norm.cu; library layers on) and the composed layer (off),
  // on shapes that take one slice per channel and many (the fmnist model's first layer), features (inner 1),
  // and a mean 1000 times the spread (the shifted sums); float32 and float64.
  struct Case {
    Shape shape;
    double scale, offset;
  };
  for (const DType dtype : {DType::Float32, DType::Float64}) {
    for (const Case& c : {Case{{16, 8, 7, 7}, 3.0, 1.5}, Case{{128, 32, 28, 28}, 1.0, 0.5}, Case{{64, 10}, 2.0, -1.0},
                          Case{{5, 3, 11}, 1.0, 0.0}, Case{{4, 2, 300}, 1.0, 1000.0}}) {
      const std::int64_t C = c.shape[1];
      const Tensor x = add(mul(randn(c.shape, {.dtype = dtype}), c.scale), c.offset);
      const Tensor probe = randn(c.shape, {.dtype = dtype});
      for (const bool library : {true, false}) {
        nn::functional::set_library_layers(library);
        const std::vector<Tensor> fused = batch_norm_pass(x, probe, true, 0.1, Activation::ReLU);
        nn::functional::set_library_layers(true);
        // Unfused reference on the cpu: relu(batch_norm(x)), composed.
        nn::functional::set_library_layers(false);
        Tensor xc = x.clone().requires_grad_();
        Tensor weight = linspace_like(C).to(dtype).requires_grad_();
        Tensor bias = mul(linspace_like(C), -0.5).to(dtype).requires_grad_();
        Tensor running_mean = full({C}, 0.25, {.dtype = dtype}), running_var = full({C}, 2.0, {.dtype = dtype});
        const Tensor out = relu(nn::functional::batch_norm(xc, running_mean, running_var, weight, bias, true, 0.1,
                                                           1e-5, full({}, 3, {.dtype = DType::Int64})));
        nn::functional::set_library_layers(true);
        sum(mul(out, probe)).backward();
        const std::vector<Tensor> expected = {out.detach(), xc.grad(), weight.grad(), bias.grad(), running_mean,
                                              running_var};
        const double tol = dtype == DType::Float32 ? 1e-4 : 1e-9;
        // An output within rounding of 0 may take the other side of the ReLU on the two devices (their scale
        // and shift round differently), which flips that element's input gradient: left out of that comparison.
        const Tensor near_zero = lt(abs(expected[0]), 1e-4);
        for (int i = 0; i < 6; ++i) {
          Tensor got = fused[i], want = expected[i];
          if (i == 1) {
            got = where(near_zero, zeros_like(got), got);
            want = where(near_zero, zeros_like(want), want);
          }
          // Gradients sum over up to 100352 elements a channel: compared relative to their largest entry.
          const double largest = max(abs(want.to(DType::Float64))).item<double>();
          EXPECT_TRUE(all_close(got, want, tol, tol * (1 + largest)))
              << i << (library ? " fused kernels " : " composed ") << shape_str(c.shape) << " " << dtype_name(dtype);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry
