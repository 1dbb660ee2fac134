// test_core_tensor.cpp — Tensor bookkeeping, views, factories, the generator, moves (invariant 3)
// and value access.
#include <limits>

#include "../src/cpu/host_cache.h"
#include "test_helpers.h"

namespace ferry {
namespace {

using testing::accelerators;
using testing::all_close;

TEST(CoreTensor, SizesAndBytes) {
  Tensor t = empty({1000, 1000});
  EXPECT_EQ(t.numel(), 1'000'000);
  EXPECT_EQ(t.nbytes(), 4'000'000u);  // Exercise 2.1
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(-1), 1000);
  EXPECT_EQ(empty({3}, {.dtype = DType::Int64}).nbytes(), 24u);
  EXPECT_EQ(empty({3}, {.dtype = DType::UInt8}).nbytes(), 3u);
  EXPECT_EQ(empty({3}, {.dtype = DType::Bool}).nbytes(), 3u);
  EXPECT_EQ(empty({2, 0, 5}).numel(), 0);
  EXPECT_EQ(empty({}).numel(), 1);
  EXPECT_THROW(empty({-1, 3}), InvalidArgument);
  EXPECT_THROW(empty({1ll << 40, 1ll << 40}), InvalidArgument);
  EXPECT_THROW(Tensor().shape(), InvalidArgument);
}

TEST(CoreTensor, FactoriesFillValues) {
  EXPECT_EQ(zeros({2, 2}).to_vector<float>(), std::vector<float>(4, 0.f));
  EXPECT_EQ(ones({3}, {.dtype = DType::Int64}).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 1, 1}));
  EXPECT_EQ(full({2}, 2.5).to_vector<float>(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(arange(4, {.dtype = DType::Int64}).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(arange(1, 2, 0.25).to_vector<float>(), (std::vector<float>{1, 1.25f, 1.5f, 1.75f}));
  EXPECT_THROW(arange(0, 1, 0), InvalidArgument);
  EXPECT_THROW(arange(0, 1, -1), InvalidArgument);
  Tensor v = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_FLOAT_EQ(v.select(0, 1).select(0, 2).item<float>(), 6.f);
  EXPECT_THROW(from_vector<float>({1, 2, 3}, {2, 2}), ShapeMismatch);
  EXPECT_EQ(from_vector<bool>({true, false}).dtype(), DType::Bool);
}

TEST(CoreTensor, RandomIsSeededAndInRange) {
  manual_seed(42);
  Tensor a = rand({1000});
  manual_seed(42);
  Tensor b = rand({1000});
  EXPECT_TRUE(all_close(a, b, 0, 0));
  const auto u = a.to_vector<float>();
  for (float x : u) ASSERT_TRUE(x >= 0 && x < 1) << x;
  Tensor n = randn({100000});
  EXPECT_NEAR(mean(n).item<double>(), 0.0, 0.02);
  EXPECT_NEAR(var(n).item<double>(), 1.0, 0.03);
  Tensor r = randint(3, 7, {1000});
  EXPECT_EQ(r.dtype(), DType::Int64);
  EXPECT_EQ(min(r).item<std::int64_t>(), 3);
  EXPECT_EQ(max(r).item<std::int64_t>(), 6);
  Tensor p = randperm(10);
  auto pv = p.to_vector<std::int64_t>();
  std::sort(pv.begin(), pv.end());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(pv[i], i);
}

// A shape with a zero in it draws nothing, on every device (a zero-sized dim used to trip the random kernel's
// contiguity check, since an empty tensor's strides are computed as if its zero sizes were 1).
TEST(CoreTensor, RandomFactoriesTakeEmptyShapes) {
  std::vector<Device> devices = accelerators();
  devices.push_back(kCPU);
  for (const Device& device : devices) {
    for (const Shape& shape : {Shape{3, 0, 10}, Shape{0}, Shape{2, 0}}) {
      EXPECT_EQ(randn(shape, {.device = device}).numel(), 0) << device.str();
      EXPECT_EQ(rand(shape, {.device = device}).shape(), shape) << device.str();
      EXPECT_EQ(randint(0, 5, shape, {.device = device}).numel(), 0) << device.str();
    }
  }
}

// Invariant 8: same seed, same numbers, any device.
TEST(CoreTensor, SameSeedSameNumbersOnEveryDevice) {
  for (const Device& device : accelerators()) {
    manual_seed(7);
    Tensor host = randn({257, 3});
    Tensor host_u = rand({33});
    Tensor host_i = randint(0, 100, {50});
    manual_seed(7);
    Tensor dev = randn({257, 3}, {.device = device});
    Tensor dev_u = rand({33}, {.device = device});
    Tensor dev_i = randint(0, 100, {50}, {.device = device});
    EXPECT_EQ(dev.device(), device);
    EXPECT_TRUE(all_close(dev.cpu(), host, 1e-6, 1e-6)) << device.str();
    EXPECT_TRUE(all_close(dev_u.cpu(), host_u, 0, 0)) << device.str();
    EXPECT_TRUE(all_close(dev_i.cpu(), host_i, 0, 0)) << device.str();
  }
}

// A 0-d tensor has no dim to index: size/narrow/slice/select/cat refuse it (they read past an empty shape before);
// transpose and squeeze of dims 0 / -1 give it back, as PyTorch does.
TEST(CoreTensor, ZeroDimTensorsHaveNoDimToIndex) {
  const Tensor s = scalar_tensor(3);
  EXPECT_THROW(s.size(0), InvalidArgument);
  EXPECT_THROW(s.narrow(0, 0, 1), InvalidArgument);
  EXPECT_THROW(s.slice(0, 0, 1), InvalidArgument);
  EXPECT_THROW(s.select(0, 0), InvalidArgument);
  EXPECT_THROW(cat({scalar_tensor(1), scalar_tensor(2)}), InvalidArgument);
  EXPECT_EQ(s.transpose(0, -1).dim(), 0);
  EXPECT_EQ(s.squeeze(0).dim(), 0);
  EXPECT_EQ(s.squeeze(0).item<double>(), 3.0);
  EXPECT_THROW(s.transpose(0, 1), InvalidArgument);
  EXPECT_THROW(s.squeeze(1), InvalidArgument);
  EXPECT_EQ(s.unsqueeze(0).shape(), (Shape{1}));
}

// Calls that gave a wrong result without a word before (the core audit against PyTorch): now refused as PyTorch does.
TEST(CoreTensor, SilentWrongResultsAreRefused) {
  EXPECT_THROW(arange(3.0).expand({-1, 3}), InvalidArgument);     // a negative size in a new leading dim
  EXPECT_THROW(ones({1, 3}).expand({-2, 3}), InvalidArgument);
  EXPECT_EQ(ones({1, 3}).expand({4, -1}).shape(), (Shape{4, 3}));   // -1 keeps an existing dim
  Tensor ints = from_vector<std::int64_t>({1, 2});
  EXPECT_THROW(ints.add_(from_vector<std::int64_t>({3, 3}), 0.5), InvalidArgument);  // alpha would round to 0
  ints.add_(from_vector<std::int64_t>({3, 3}), 2);
  EXPECT_EQ(ints.to_vector<std::int64_t>(), (std::vector<std::int64_t>{7, 8}));
  const Tensor mask = from_vector<bool>({true, false});
  EXPECT_THROW(sub(mask, from_vector<bool>({true, true})), InvalidArgument);  // gave the lhs back
  EXPECT_THROW(neg(mask), InvalidArgument);
  EXPECT_THROW(abs(mask), InvalidArgument);
  EXPECT_THROW(relu(mask), InvalidArgument);
  EXPECT_EQ(logical_not(mask).to_vector<bool>(), (std::vector<bool>{false, true}));
}

TEST(CoreTensor, ViewsShareStorage) {
  Tensor t = arange(0, 12, 1, {.dtype = DType::Float32}).reshape({3, 4});
  Tensor tr = t.t();
  EXPECT_EQ(tr.shape(), (Shape{4, 3}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.storage(), t.storage());
  EXPECT_FLOAT_EQ(tr.select(0, 1).select(0, 2).item<float>(), 9.f);
  Tensor row = t.select(0, 1);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{4, 5, 6, 7}));
  Tensor col = t.narrow(1, 1, 2);
  EXPECT_EQ(col.contiguous().to_vector<float>(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(t.slice(1, -2, 100).contiguous().to_vector<float>(), (std::vector<float>{2, 3, 6, 7, 10, 11}));
  row.fill_(-1);  // writes through the view
  EXPECT_FLOAT_EQ(t.select(0, 1).select(0, 0).item<float>(), -1.f);
  EXPECT_EQ(tr.contiguous().shape(), (Shape{4, 3}));
  EXPECT_TRUE(tr.contiguous().is_contiguous());
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(tr.reshape({12}).to_vector<float>()[1], -1.f);  // strided reshape copies (t[1][0], filled above)
  EXPECT_THROW(tr.view({12}), InvalidArgument);
  EXPECT_THROW(t.reshape({5, -1}), ShapeMismatch);
  EXPECT_THROW(t.narrow(0, 2, 2), InvalidArgument);
  EXPECT_THROW(t.select(2, 0), InvalidArgument);
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(t.permute({1, 0}).shape(), (Shape{4, 3}));
  EXPECT_EQ(t.flatten().shape(), (Shape{12}));
  EXPECT_THROW(ones({2, 3, 4}).flatten(2, 0), InvalidArgument);
  EXPECT_EQ(ones({3, 1}).expand({3, 5}).strides()[1], 0);
  EXPECT_THROW(ones({3, 2}).expand({3, 5}), ShapeMismatch);
}

// Invariant 3 and Exercises 1.1 / 1.2: to() and cpu() never mutate; already there = alias.
TEST(CoreTensor, MovesNeverMutateAndAliasWhenAlreadyThere) {
  for (const Device& device : accelerators()) {
    Tensor x = randn({4, 4});
    const std::vector<float> before = x.to_vector<float>();
    Ledger::global().clear();
    Tensor y = x.to(device);
    EXPECT_EQ(x.device(), kCPU);
    EXPECT_EQ(y.device(), device);
    EXPECT_EQ(x.to_vector<float>(), before);
    EXPECT_EQ(Ledger::global().totals().transfers, 1);
    EXPECT_EQ(Ledger::global().totals().bytes_host_to_device, 64);
    Tensor same = y.to(device);
    EXPECT_TRUE(same.is_same(y));
    EXPECT_EQ(Ledger::global().totals().transfers, 1);  // no copy, no entry
    EXPECT_TRUE(x.cpu().is_same(x));
    Tensor back = y.cpu();
    EXPECT_EQ(back.device(), kCPU);
    EXPECT_EQ(back.to_vector<float>(), before);
    EXPECT_EQ(y.device(), device);
    EXPECT_EQ(Ledger::global().totals().bytes_device_to_host, 64);
  }
}

TEST(CoreTensor, StridedMovesAndCrossDeviceCopies) {
  Tensor x = arange(0, 6, 1, {.dtype = DType::Float32}).reshape({2, 3}).t();
  Tensor on_sim = x.to(Device::parse("sim:0"));
  EXPECT_TRUE(on_sim.is_contiguous());
  EXPECT_EQ(on_sim.cpu().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor other = on_sim.to(Device::parse("sim:1"));
  EXPECT_EQ(other.device(), Device::parse("sim:1"));
  EXPECT_EQ(other.cpu().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor dst = zeros({3, 2}, {.device = Device::parse("sim:1")});
  dst.copy_(x);
  EXPECT_EQ(dst.cpu().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

// copy_(device -> host, non_blocking) into pageable (or strided) host memory reads the crossing's result at once,
// so it must have finished: it is done blocking (and counted as the sync it is); into a pinned contiguous host
// tensor it stays asynchronous and the caller syncs. Values right either way, on every accelerator.
TEST(CoreTensor, NonBlockingCopyIntoHostMemoryIsCompleteWhenRead) {
  for (const Device& device : accelerators()) {
    manual_seed(3);
    const Tensor src = randn({256, 64}, {.device = device});
    const std::vector<float> expected = src.cpu().to_vector<float>();
    Tensor dst = zeros({256, 64});
    dst.copy_(src, true);
    EXPECT_EQ(dst.to_vector<float>(), expected) << device.str();
    Tensor strided = zeros({64, 256}).t();
    strided.copy_(src, true);
    EXPECT_EQ(strided.contiguous().to_vector<float>(), expected) << device.str();
    if (device.is_cuda()) {
      Tensor pinned = zeros({256, 64}).pin_memory();
      pinned.copy_(src, true);
      synchronize(device);
      EXPECT_EQ(pinned.to_vector<float>(), expected) << device.str();
    }
  }
}

TEST(CoreTensor, DtypeConversion) {
  Tensor f = from_vector<float>({1.5f, -2.7f, 0.f});
  EXPECT_EQ(f.to(DType::Int64).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, -2, 0}));
  EXPECT_EQ(f.to(DType::Bool).to_vector<bool>(), (std::vector<bool>{true, true, false}));
  EXPECT_TRUE(f.to(DType::Float32).is_same(f));
  EXPECT_EQ(f.to(DType::Float64).dtype(), DType::Float64);
  EXPECT_EQ(parse_dtype("float32"), DType::Float32);
  EXPECT_THROW(parse_dtype("float8"), InvalidArgument);
  EXPECT_EQ(promote_types(DType::Int64, DType::Float32), DType::Float32);
}

// The cpu keeps freed blocks of 64 KiB and more for the next request of the same size (no fresh pages every
// training step): they count as reserved, not allocated, and empty_cache() gives them back. (Under
// AddressSanitizer the cache is off: every block is freed at once and reserved stays equal to allocated.)
TEST(CoreTensor, CpuReusesLargeBlocksAndEmptyCacheReleasesThem) {
  Backend& cpu = backend(kCPU);
  cpu.empty_cache(0);
  const MemoryStats before = cpu.memory_stats(0);
  EXPECT_EQ(before.reserved, before.allocated);
  const void* first = nullptr;
  {
    Tensor big = empty({1 << 20});  // 4 MiB
    first = big.data_ptr();
    EXPECT_GE(cpu.memory_stats(0).allocated, before.allocated + (4 << 20));
  }
  const MemoryStats freed = cpu.memory_stats(0);
  EXPECT_EQ(freed.allocated, before.allocated);
  if (freed.reserved > freed.allocated) {  // cached: the same size gets the same block back
    EXPECT_EQ(freed.reserved - freed.allocated, std::int64_t{4} << 20);
    Tensor again = empty({1 << 20});
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(cpu.memory_stats(0).reserved, cpu.memory_stats(0).allocated);
  }
  cpu.empty_cache(0);
  const MemoryStats emptied = cpu.memory_stats(0);
  EXPECT_EQ(emptied.reserved, emptied.allocated);
}

TEST(CoreTensor, ItemAndPrinting) {
  EXPECT_DOUBLE_EQ(full({}, 3.25).item<double>(), 3.25);
  EXPECT_THROW(ones({2}).item<float>(), InvalidArgument);
  EXPECT_EQ(from_vector<std::int64_t>({1, 2}).str(), "tensor([1, 2])");
  EXPECT_EQ(zeros({2, 2}, {.device = Device::parse("sim:0")}).str(),
            "tensor([[0., 0.],\n        [0., 0.]], device='sim:0')");
}

// What PyTorch prints for the same tensors (str() in torch 1.13 with its default print options; dtype names are
// ferry's): notation chosen from the values, one width per tensor, 80 columns, summaries beyond 1000 elements.
TEST(CoreTensor, PrintsAsPyTorchDoes) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(from_vector<float>({1, 2}).str(), "tensor([1., 2.])");
  EXPECT_EQ(zeros({2, 2, 3}).str(),
            "tensor([[[0., 0., 0.],\n         [0., 0., 0.]],\n\n        [[0., 0., 0.],\n         [0., 0., 0.]]])");
  EXPECT_EQ(arange(100).str(),
            "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
            "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,\n"
            "        36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,\n"
            "        54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71,\n"
            "        72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89,\n"
            "        90, 91, 92, 93, 94, 95, 96, 97, 98, 99])");
  EXPECT_EQ(from_vector<float>({1e-5f, 1}).str(), "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(from_vector<bool>({true, false}).str(), "tensor([ True, False])");
  EXPECT_EQ(scalar_tensor(1152921504606846977.0, {.dtype = DType::Int64}).str(), "tensor(1152921504606846976)");
  EXPECT_EQ(from_vector<std::int64_t>({1152921504606846977}).reshape({}).str(), "tensor(1152921504606846977)");
  EXPECT_EQ(from_vector<double>({nan, 1.5, -inf}).to(DType::Float32).str(), "tensor([   nan, 1.5000,   -inf])");
  EXPECT_EQ(from_vector<double>({-nan}).to(DType::Float32).str(), "tensor([nan])");  // not printf's -nan
  EXPECT_EQ(arange(0, 2000, 1, {.dtype = DType::Float32}).reshape({2, 1000}).str(),
            "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.9700e+02, 9.9800e+02,\n"
            "         9.9900e+02],\n"
            "        [1.0000e+03, 1.0010e+03, 1.0020e+03,  ..., 1.9970e+03, 1.9980e+03,\n"
            "         1.9990e+03]])");
  EXPECT_EQ(empty({0, 3}).str(), "tensor([], size=(0, 3))");
  EXPECT_EQ(from_vector<std::uint8_t>({1, 2}).str(), "tensor([1, 2], dtype=uint8)");
  EXPECT_EQ(scalar_tensor(3).str(), "tensor(3.)");
  EXPECT_EQ(from_vector<float>({-1.25f, 0.5f, 100}).str(), "tensor([ -1.2500,   0.5000, 100.0000])");
  EXPECT_EQ(from_vector<double>({0.1, 0.2}).str(), "tensor([0.1000, 0.2000], dtype=float64)");
  EXPECT_EQ(empty({0}, {.dtype = DType::Int64}).str(), "tensor([], dtype=int64)");
  EXPECT_EQ(from_vector<float>({1.5f, 2}, Shape{2}, {.requires_grad = true}).str(), "tensor([1.5000, 2.0000], requires_grad=True)");
  EXPECT_EQ(div(arange(0, 3000, 1, {.dtype = DType::Float32}).reshape({3, 1000}), 7.0).str(),
            "tensor([[0.0000e+00, 1.4286e-01, 2.8571e-01,  ..., 1.4243e+02, 1.4257e+02,\n"
            "         1.4271e+02],\n"
            "        [1.4286e+02, 1.4300e+02, 1.4314e+02,  ..., 2.8529e+02, 2.8543e+02,\n"
            "         2.8557e+02],\n"
            "        [2.8571e+02, 2.8586e+02, 2.8600e+02,  ..., 4.2814e+02, 4.2829e+02,\n"
            "         4.2843e+02]])");
}

TEST(CoreTensor, MemoryStatsCountAllocations) {
  Backend& sim = backend(DeviceType::Sim);
  const auto before = sim.memory_stats(1).allocated;
  {
    Tensor t = empty({1000}, {.device = Device::parse("sim:1")});
    EXPECT_EQ(sim.memory_stats(1).allocated, before + 4000);
  }
  EXPECT_EQ(sim.memory_stats(1).allocated, before);
}

// A sim device keeps freed blocks as a card's memory pool does: reserved, not allocated, reused by the next request
// of the same size, given back by empty_cache(); free is the capacity less what is reserved. Its capacity counts
// live bytes only: a request that fits only without the cache gives the cache back and succeeds. (Under
// AddressSanitizer the cache is off and only the counting is checked.)
TEST(CoreTensor, SimKeepsFreedBlocksAsACardsPoolDoes) {
  Backend& sim = backend(DeviceType::Sim);
  const Device sim1 = Device::parse("sim:1");
  sim.empty_cache(1);
  const MemoryStats before = sim.memory_stats(1);
  EXPECT_EQ(before.reserved, before.allocated);
  EXPECT_EQ(before.free, before.total - before.reserved);
  const void* first = nullptr;
  {
    Tensor block = empty({1 << 20}, {.device = sim1});  // 4 MiB
    first = block.data_ptr();
  }
  const MemoryStats freed = sim.memory_stats(1);
  EXPECT_EQ(freed.allocated, before.allocated);
  EXPECT_EQ(freed.free, freed.total - freed.reserved);
  if (cpu::host_cache_limit() == 0) {  // AddressSanitizer: every block freed at once
    EXPECT_EQ(freed.reserved, freed.allocated);
    return;
  }
  EXPECT_EQ(freed.reserved - freed.allocated, std::int64_t{4} << 20);
  {
    Tensor again = empty({1 << 20}, {.device = sim1});
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(sim.memory_stats(1).reserved, sim.memory_stats(1).allocated);
  }
  sim.empty_cache(1);
  EXPECT_EQ(sim.memory_stats(1).reserved, sim.memory_stats(1).allocated);

  // 3 GiB cached, then 6 GiB asked for: 9 GiB reserved would pass the 8 GiB capacity, 6 GiB live does not. Neither
  // block is written, so the host maps no pages for them.
  const std::int64_t gib = std::int64_t{1} << 30;
  { Tensor three = empty({3 * gib / 4}, {.device = sim1}); }
  if (cpu::host_cache_limit() < static_cast<std::size_t>(3 * gib)) GTEST_SKIP() << "3 GiB is over the cache's limit";
  EXPECT_EQ(sim.memory_stats(1).reserved - sim.memory_stats(1).allocated, 3 * gib);
  EXPECT_LT(sim.memory_stats(1).free, 6 * gib);
  {
    Tensor six = empty({6 * gib / 4}, {.device = sim1});
    const MemoryStats during = sim.memory_stats(1);
    EXPECT_EQ(during.reserved, during.allocated);  // the cache went first
    EXPECT_EQ(during.allocated, before.allocated + 6 * gib);
  }
  sim.empty_cache(1);
}

TEST(CoreTensor, OutOfMemoryHasTheNumbersAndTheProcessComputesOn) {
  const Device sim = Device::parse("sim:1");
  try {
    empty({std::int64_t{1} << 40}, {.device = sim});
    FAIL() << "allocated 4 TiB on sim:1";
  } catch (const OutOfMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("4398046511104 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("sim:1"), std::string::npos) << message;
    EXPECT_NE(message.find("total"), std::string::npos) << message;
  }
  Tensor ok = ones({10}, {.device = sim});
  EXPECT_DOUBLE_EQ(sum(ok).item<double>(), 10.0);
}

TEST(CoreTensor, PinMemoryNeedsCuda) {
  if (is_available(DeviceType::CUDA)) {
    Tensor p = ones({4}).pin_memory();
    EXPECT_TRUE(p.is_pinned());
  } else {
    EXPECT_THROW(ones({4}).pin_memory(), Error);
  }
}

// In-place writes follow PyTorch's rules, so none computes a wrong value or gradient without a word: a tensor autograd
// tracks is written only under NoGradGuard (ferry records no history for in-place ops), an expand()ed view only by
// fill_, and a source that partly overlaps the written memory is refused (the same view is fine). Found by comparing
// with PyTorch: b.add_(1) after c = b * b gave a.grad [4, 6] instead of an error (the right one is [2, 4]), and
// w.add_(w.t()) gave [0, 3, 5, 6] instead of [0, 3, 3, 6].
TEST(CoreTensor, InPlaceWritesFollowPyTorchsRules) {
  for (const Device device : {kCPU, Device::parse("sim:0")}) {
    SCOPED_TRACE(device.str());
    Tensor a = from_vector<float>({1, 2}, {.device = device, .requires_grad = true});
    EXPECT_THROW(a.add_(ones({2}, {.device = device})), InvalidArgument);  // a leaf that requires grad
    Tensor b = a * 1.0;
    Tensor c = b * b;
    EXPECT_THROW(b.add_(ones({2}, {.device = device})), NotSupported);  // b is in c's history
    EXPECT_THROW(b.mul_(3), NotSupported);
    {
      autograd::NoGradGuard no_grad;  // as optimizers update parameters
      a.add_(ones({2}, {.device = device}), 0.5);
    }
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.5f, 2.5f}));
    sum(c).backward();
    EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{2, 4}));  // c's gradient, untouched by the attempts

    // A source partly overlapping the written memory: refused. The same view (x += x) is fine.
    Tensor w = arange(0, 4, 1, {.device = device, .dtype = DType::Float32}).reshape({2, 2});
    EXPECT_THROW(w.add_(w.t()), InvalidArgument);
    EXPECT_THROW(w.copy_(w.t()), InvalidArgument);
    Tensor row = arange(0, 6, 1, {.device = device, .dtype = DType::Float32});
    EXPECT_THROW(row.narrow(0, 1, 5).copy_(row.narrow(0, 0, 5)), InvalidArgument);
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));  // nothing written
    w.add_(w);
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 2, 4, 6}));
    row.narrow(0, 0, 3).copy_(row.narrow(0, 3, 3));  // disjoint parts of one storage
    EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{3, 4, 5, 3, 4, 5}));

    // An expand()ed view: one element under several indices. fill_ writes one value, so it may.
    Tensor base = from_vector<float>({1, 2, 3}, {1, 3}, {.device = device});
    EXPECT_THROW(base.expand({4, 3}).add_(ones({4, 3}, {.device = device})), InvalidArgument);
    EXPECT_THROW(base.expand({4, 3}).mul_(2), InvalidArgument);
    EXPECT_THROW(base.expand({4, 3}).copy_(ones({4, 3}, {.device = device})), InvalidArgument);
    EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{1, 2, 3}));
    base.expand({4, 3}).fill_(7);
    EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{7, 7, 7}));

    // An integer tensor keeps its dtype: a scalar it cannot hold is an error, not a truncation (3 * 1.5 -> 3).
    Tensor counts = full({3}, 3, {.device = device, .dtype = DType::Int64});
    EXPECT_THROW(counts.mul_(1.5), DTypeMismatch);
    counts.mul_(2);
    EXPECT_EQ(counts.to_vector<std::int64_t>(), (std::vector<std::int64_t>{6, 6, 6}));
  }
}

// An assigned gradient must fit its tensor (PyTorch checks it too): an optimizer would broadcast a [1] gradient over
// a [2] parameter, or mix dtypes, without a word.
TEST(CoreTensor, SetGradChecksShapeDtypeAndDevice) {
  Tensor p = ones({2}, {.requires_grad = true});
  EXPECT_THROW(p.set_grad(ones({1})), ShapeMismatch);
  EXPECT_THROW(p.set_grad(ones({2}, {.dtype = DType::Float64})), DTypeMismatch);
  EXPECT_THROW(p.set_grad(ones({2}, {.device = Device::parse("sim:0")})), DeviceMismatch);
  p.set_grad(full({2}, 0.5));
  EXPECT_EQ(p.grad().to_vector<float>(), (std::vector<float>{0.5f, 0.5f}));
  p.set_grad(Tensor());
  EXPECT_FALSE(p.grad().defined());
}

// PyTorch's view conveniences: narrow from a negative start counts from the end; t() leaves 0-d and 1-d tensors.
TEST(CoreTensor, NarrowFromTheEndAndTransposeOfAVector) {
  Tensor v = arange(0, 6, 1, {.dtype = DType::Float32});
  EXPECT_EQ(v.narrow(0, -2, 2).to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_THROW(v.narrow(0, -7, 1), InvalidArgument);
  EXPECT_THROW(v.narrow(0, 5, 2), InvalidArgument);
  EXPECT_EQ(v.t().shape(), Shape{6});
  EXPECT_EQ(full({}, 2.0).t().shape(), Shape{});
  EXPECT_EQ(v.reshape({2, 3}).t().shape(), (Shape{3, 2}));
}

}  // namespace
}  // namespace ferry
