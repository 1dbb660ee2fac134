// test_core_exercises.cpp — Exercises 1.1, 1.2, 2.1 and 4.3 of the sheet (shared/seed), written
// against ferry's API, on every accelerator this machine has (sim here; cuda where a GPU exists).
#include "test_helpers.h"

namespace ferry {
namespace {

using testing::accelerators;

// 1.1: which device does each tensor end up on?
TEST(SheetExercises, Ex1_1_WhichDevice) {
  for (const Device& device : accelerators()) {
    Tensor a = randn({4, 4});                        // (i)
    Tensor b = randn({4, 4}, {.device = device});    // (ii)
    Tensor c = a.to(device);                         // (iii)
    Tensor d = b.cpu();                              // (iv)
    EXPECT_EQ(a.device(), kCPU);
    EXPECT_EQ(b.device(), device);
    EXPECT_EQ(c.device(), device);
    EXPECT_EQ(d.device(), kCPU);
    EXPECT_EQ(a.device(), kCPU) << "to() must not move a";
  }
}

// 1.2: after x_gpu = x.to(device), x is still on the cpu.
TEST(SheetExercises, Ex1_2_ToDoesNotMoveTheOriginal) {
  for (const Device& device : accelerators()) {
    Tensor x = randn({3});
    Tensor x_gpu = x.to(device);
    EXPECT_EQ(x.device(), kCPU);
    EXPECT_EQ(x_gpu.device(), device);
    x = x.to(device);  // reuse the name to move it
    EXPECT_EQ(x.device(), device);
  }
}

// 2.1: a (1000, 1000) float32 tensor is 4 MB (4e6 bytes); moving it carries exactly that.
TEST(SheetExercises, Ex2_1_TensorSize) {
  Tensor t = zeros({1000, 1000});
  EXPECT_EQ(t.numel(), 1'000'000);
  EXPECT_EQ(t.nbytes(), 4'000'000u);
  for (const Device& device : accelerators()) {
    Ledger::global().clear();
    Tensor moved = t.to(device);
    EXPECT_EQ(Ledger::global().totals().bytes_host_to_device, 4'000'000);
  }
}

// 4.3: x on the accelerator + y on the cpu crashes with PyTorch's message; y.to(x.device()) fixes it.
TEST(SheetExercises, Ex4_3_DebugTheDeviceError) {
  for (const Device& device : accelerators()) {
    Tensor x = randn({100, 100}).to(device);
    Tensor y = randn({100, 100});
    try {
      Tensor z = x + y;
      FAIL() << "x + y across devices did not throw";
    } catch (const DeviceMismatch& e) {
      const std::string message = e.what();
      const std::string first_line = message.substr(0, message.find('\n'));
      EXPECT_EQ(first_line, "Expected all tensors to be on the same device, but found at least two devices, " +
                                device.str() + " and cpu! (in add)");
      EXPECT_NE(message.find("40000 bytes cpu -> " + device.str()), std::string::npos) << message;
    }
    y = y.to(x.device());  // the portable one-line fix
    Tensor z = x + y;
    EXPECT_EQ(z.device(), device);
  }
}

}  // namespace
}  // namespace ferry
