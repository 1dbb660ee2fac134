// test_ready_reads.cpp — loss.item() waits for the loss, not for the work queued after it (src/core/ready_event.h).
// On the emulated card a test can queue work that the host holds back: an item after the loss that stays in
// flight (emulator.h: finish_later) until the test lets it go. A read that waited for the device's whole queue
// would then wait for the test itself; so the held item gives up after a deadline and says so, and the test fails
// there instead of hanging. Every schedule of the emulator runs these (lazy streams, one stream eager, random).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#include "emulator.h"
#include "ferry/ferry.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/optim.h"
#include "ferry/step_graph.h"

namespace ferry {
namespace {

const Device kCuda{DeviceType::CUDA, 0};

// Work on the compute stream of cuda:0 that stays in flight until released, or until `deadline` has passed
// (then `gave_up`): what a long backward pass queued after the loss looks like to the host.
struct HeldWork {
  std::atomic<bool> released{false}, gave_up{false};

  // Enqueued inside a graph capture, it is a node of the graph: held back on every replay.
  void enqueue(std::chrono::seconds deadline = std::chrono::seconds(3)) {
    auto* stream = static_cast<cudaStream_t>(backend(kCuda).compute_stream(0).handle);
    emu::enqueue(stream, [this, deadline] {
      const auto until = std::chrono::steady_clock::now() + deadline;
      emu::finish_later([this, until] {
        if (released.load()) return true;
        if (std::chrono::steady_clock::now() < until) return false;
        gave_up.store(true);
        return true;
      });
    });
  }
};

// A batch and a small classifier on cuda:0 whose loss the tests read.
struct Problem {
  Tensor x, y;
  std::shared_ptr<nn::Linear> model;
  Problem() {
    manual_seed(5);
    x = randn({16, 8}).to(kCuda);
    y = randint(0, 4, {16}).to(kCuda);
    model = std::make_shared<nn::Linear>(8, 4);
    model->to(kCuda);
  }
};

// Whether the emulator's schedule runs the compute stream's work as it is queued (FERRY_EMU_EAGER_STREAM=1) or may
// (a random schedule): a replay has then run to its end before the host reads, and nothing is left to hold back.
bool compute_stream_may_run_ahead() {
  const char* eager = std::getenv("FERRY_EMU_EAGER_STREAM");
  const char* seed = std::getenv("FERRY_EMU_SCHEDULE_SEED");
  return (eager && std::string(eager) == "1") || (seed && std::string(seed) != "0");
}

TEST(ReadyReads, ALossIsReadWhileTheWorkQueuedAfterItIsHeldBack) {
  Problem p;
  const Tensor loss = nn::functional::cross_entropy(p.model->forward(p.x), p.y);
  HeldWork held;
  held.enqueue();
  const double value = loss.item<double>();
  EXPECT_FALSE(held.gave_up.load()) << "item() waited for the work queued after the loss";
  held.released = true;
  synchronize(kCuda, "test: the held work is done");
  EXPECT_FALSE(held.gave_up.load());
  // The same bytes read after everything (a copy of them has no mark): the early read saw the final value.
  EXPECT_EQ(value, mul(loss.detach(), 1.0).item<double>());
  EXPECT_TRUE(std::isfinite(value));
}

TEST(ReadyReads, AValueWrittenInPlaceAfterItsLossIsReadAfterTheWrite) {
  Problem p;
  Tensor loss = nn::functional::cross_entropy(p.model->forward(p.x), p.y).detach();  // shares the marked storage
  const double first = loss.item<double>();
  loss.mul_(2.0);  // queued after the loss's ready event: the mark is stale now
  EXPECT_NEAR(loss.item<double>(), 2 * first, 1e-6);
  // A value that is not a loss has no mark: its read waits for the whole queue, the held work included.
  const Tensor plain = sum(p.x);
  HeldWork held;
  held.enqueue(std::chrono::seconds(1));
  (void)plain.item<double>();
  EXPECT_TRUE(held.gave_up.load()) << "an unmarked read did not wait for the work before it";
}

TEST(ReadyReads, AReplayedStepsLossIsReadBeforeTheRestOfTheReplayRuns) {
  Problem p;
  optim::SGD optimizer(p.model->parameters(), {.lr = 0.1, .momentum = 0.9, .lr_on_device = true});
  HeldWork* held = nullptr;  // set for the replays only: the capture records its enqueue as a node
  StepGraph step(p.model->parameters(), [&](const Tensor& x, const Tensor& y) {
    Tensor loss = nn::functional::cross_entropy(p.model->forward(x), y);
    loss.backward();
    if (held) held->enqueue();  // after the loss, before the update: inside the graph once captured
    optimizer.step();
    return loss.detach();
  });
  // Eager warm-up steps, then the capture and its first replay: the held work is recorded into the graph, and
  // released at once until the replay below.
  HeldWork recorded;
  recorded.released = true;
  held = &recorded;
  for (int i = 0; i < 3; ++i) (void)step.run(p.x, p.y).item<double>();
  synchronize(kCuda, "test: the first replay is done");  // its held node too, which item() left queued
  ASSERT_NE(step.describe().find("1 event record"), std::string::npos) << step.describe();
  // A replay: its held node waits for `recorded`, which a read that drained the queue would wait for too. (Where the
  // compute stream may run ahead, the replay runs at its launch: nothing may be held there.)
  recorded.released = compute_stream_may_run_ahead();
  const Tensor loss = step.run(p.x, p.y);
  const double value = loss.item<double>();
  EXPECT_FALSE(recorded.gave_up.load()) << "item() of a replayed step waited for the rest of the replay";
  recorded.released = true;
  synchronize(kCuda, "test: the replay is done");
  // The same bytes read after the whole replay (a copy of them has no mark): the early read saw the replay's loss.
  EXPECT_EQ(value, mul(loss, 1.0).item<double>());
  EXPECT_TRUE(std::isfinite(value));
}

}  // namespace
}  // namespace ferry
