// test_train.cpp — the data loader's placements and order, checkpoints, and the training loop:
// loss goes down, resume continues bit for bit, and the loop reads values back only at log steps.
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <utility>
#include <sstream>

#include "ferry/checkpoint.h"
#include "ferry/dataloader.h"
#include "ferry/ledger.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/trainer.h"
#include "test_helpers.h"

namespace ferry {
namespace {

const Device kSim0{DeviceType::Sim, 0};

// A small synthetic dataset shaped like Fashion-MNIST: the label is which quadrant is brightest.
Dataset quadrant_dataset(std::int64_t n, std::uint64_t seed) {
  manual_seed(seed);
  Tensor images = mul(randn({n, 1, 28, 28}), 0.3);
  Tensor labels = randint(0, 4, {n});
  const auto label_values = labels.to_vector<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t q = label_values[static_cast<std::size_t>(i)];
    images.select(0, i).narrow(1, (q / 2) * 14, 14).narrow(2, (q % 2) * 14, 14).add_(ones({1, 14, 14}));
  }
  return {images, labels};
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ferry_test_" + std::to_string(getpid()) + "_" + name)).string();
}

TEST(DataLoader, OrderIsSeededPerEpochAndCoversEverySample) {
  Dataset d = quadrant_dataset(10, 1);
  DataLoader loader(d, {.batch_size = 4, .seed = 3});
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  auto epoch_labels = [&](std::int64_t epoch) {
    loader.start_epoch(epoch);
    std::vector<std::int64_t> all;
    Batch b;
    std::vector<std::int64_t> sizes;
    while (loader.next(b)) {
      sizes.push_back(b.labels.numel());
      for (auto v : b.labels.to_vector<std::int64_t>()) all.push_back(v);
    }
    EXPECT_EQ(sizes, (std::vector<std::int64_t>{4, 4, 2}));
    return all;
  };
  const auto e0 = epoch_labels(0), e0_again = epoch_labels(0), e1 = epoch_labels(1);
  EXPECT_EQ(e0, e0_again);
  auto sorted0 = e0, sorted1 = e1, expected = d.labels.to_vector<std::int64_t>();
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sorted0, expected);
  EXPECT_EQ(sorted1, expected);
  DataLoader drop(d, {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_THROW(DataLoader(d, {.batch_size = 0}), InvalidArgument);
  EXPECT_THROW(parse_placement("pinned"), InvalidArgument);
}

// The loader checks what it is given: one int64 label per image, and a first batch inside the epoch.
TEST(DataLoader, RefusesMismatchedDatasetsAndBatchesOutsideTheEpoch) {
  const Dataset good = quadrant_dataset(10, 1);
  EXPECT_THROW(DataLoader(Dataset{good.images, ferry::take(good, 5).labels}, {.batch_size = 4}), ShapeMismatch);
  EXPECT_THROW(DataLoader(Dataset{good.images, good.labels.to(DType::Float32)}, {.batch_size = 4}), DTypeMismatch);
  DataLoader loader(good, {.batch_size = 4, .shuffle = false});
  EXPECT_THROW(loader.start_epoch(0, -1), InvalidArgument);
  EXPECT_THROW(loader.start_epoch(0, 4), InvalidArgument);
  loader.start_epoch(0, 3);  // the epoch's end: no batch left
  Batch b;
  EXPECT_FALSE(loader.next(b));
}

TEST(DataLoader, PlacementsGiveTheSameBatchesWithDifferentCrossings) {
  Dataset d = quadrant_dataset(64, 2);
  std::vector<std::vector<float>> reference;
  for (Placement placement : {Placement::Resident, Placement::PerStep, Placement::Prefetch}) {
    Ledger::global().clear();
    DataLoader loader(d, {.batch_size = 16, .seed = 9, .placement = placement, .device = kSim0});
    const auto after_setup = Ledger::global().totals().transfers;
    loader.start_epoch(0);
    Batch b;
    std::vector<std::vector<float>> got;
    while (loader.next(b)) {
      EXPECT_EQ(b.images.device(), kSim0);
      got.push_back(b.images.cpu().to_vector<float>());
    }
    if (reference.empty()) reference = got;
    EXPECT_EQ(got, reference) << placement_name(placement);
    if (placement == Placement::Resident) {
      EXPECT_EQ(after_setup, 2);  // images and labels, once
      EXPECT_EQ(loader.resident_bytes(), 64 * 784 * 4 + 64 * 8);
    } else {
      EXPECT_EQ(loader.resident_bytes(), 0);
      EXPECT_GE(Ledger::global().totals().bytes_host_to_device, 64 * 784 * 4);  // every batch crossed
    }
  }
}

// next_into: the resident batches gathered straight into the given tensors (a step graph's inputs), the same
// values as next(); the shorter last batch, and other placements, come as from next().
TEST(DataLoader, NextIntoGathersAResidentBatchStraightIntoTheGivenTensors) {
  Dataset d = quadrant_dataset(40, 4);  // batches of 16, 16, 8
  const Tensor images = empty({16, 1, 28, 28}, {.device = kSim0}), labels = empty({16}, {.device = kSim0, .dtype = DType::Int64});
  for (Placement placement : {Placement::Resident, Placement::PerStep}) {
    DataLoader plain(d, {.batch_size = 16, .seed = 5, .placement = placement, .device = kSim0});
    DataLoader into(d, {.batch_size = 16, .seed = 5, .placement = placement, .device = kSim0});
    plain.start_epoch(1);
    into.start_epoch(1);
    Batch a, b;
    int batches = 0;
    while (plain.next(a)) {
      ASSERT_TRUE(into.next_into(b, images, labels));
      EXPECT_EQ(b.index, a.index);
      const bool straight = placement == Placement::Resident && a.labels.numel() == 16;
      EXPECT_EQ(b.images.data_ptr() == images.data_ptr(), straight) << placement_name(placement) << " " << a.index;
      EXPECT_EQ(b.labels.data_ptr() == labels.data_ptr(), straight);
      EXPECT_EQ(b.images.cpu().to_vector<float>(), a.images.cpu().to_vector<float>());
      EXPECT_EQ(b.labels.cpu().to_vector<std::int64_t>(), a.labels.cpu().to_vector<std::int64_t>());
      ++batches;
    }
    EXPECT_EQ(batches, 3);
    EXPECT_FALSE(into.next_into(b, images, labels));
  }
  // The gather into a tensor of the wrong dtype is an error naming both.
  DataLoader loader(d, {.batch_size = 16, .seed = 5, .placement = Placement::Resident, .device = kSim0});
  loader.start_epoch(0);
  Batch b;
  const Tensor wrong = empty({16}, {.device = kSim0, .dtype = DType::Int32});
  EXPECT_THROW(loader.next_into(b, images, wrong), ShapeMismatch);
}

// A device model's tensors cross to the host under the label "checkpoint" (what a budget error would name), and a
// stopped epoch's running sums come back exactly.
TEST(Checkpoint, CopiesAreLabelledAndEpochSumsRoundTrip) {
  nn::Linear model(3, 2, true, {.device = Device::parse("sim:0")});
  const std::string path = temp_path("labelled.safetensors");
  Ledger& ledger = Ledger::global();
  const std::size_t before = ledger.transfers().size();
  TrainingProgress progress{.epoch = 1, .batch_in_epoch = 5, .global_step = 12};
  progress.epoch_sums = EpochSums{.loss_sum = 0.1 + 0.2, .correct = 41, .seen = 80};
  save_checkpoint(path, model, nullptr, {.progress = progress});
  const auto transfers = ledger.transfers();
  ASSERT_EQ(transfers.size() - before, 2u);  // weight, bias
  for (std::size_t i = before; i < transfers.size(); ++i) EXPECT_EQ(transfers[i].label, "checkpoint");
  const CheckpointContents read = read_checkpoint_contents(path);
  ASSERT_TRUE(read.progress.epoch_sums.has_value());
  EXPECT_EQ(read.progress.epoch_sums->loss_sum, 0.1 + 0.2);  // the double's exact bits
  EXPECT_EQ(read.progress.epoch_sums->correct, 41);
  EXPECT_EQ(read.progress.epoch_sums->seen, 80);
  save_checkpoint(path, model, nullptr, {.progress = {.epoch = 2}});
  EXPECT_FALSE(read_checkpoint_contents(path).progress.epoch_sums.has_value());
  std::filesystem::remove(path);
}

TEST(Checkpoint, RoundTripsModelOptimizerAndProgress) {
  manual_seed(4);
  auto model = make_fmnist_model();
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  Dataset d = quadrant_dataset(8, 5);
  Tensor loss = nn::cross_entropy((*model)(d.images), d.labels);
  loss.backward();
  sgd.step();
  const std::string path = temp_path("roundtrip.safetensors");
  save_checkpoint(path, *model, &sgd, {.progress = {2, 3, 40}, .generator = {7, 12}, .settings = {{"lr", "0.1"}}});
  manual_seed(99);
  auto other = make_fmnist_model();
  optim::SGD other_sgd(other->parameters(), {.lr = 0.1, .momentum = 0.9});
  const CheckpointContents c = load_checkpoint(path, *other, &other_sgd);
  EXPECT_EQ(c.progress.epoch, 2);
  EXPECT_EQ(c.progress.batch_in_epoch, 3);
  EXPECT_EQ(c.progress.global_step, 40);
  EXPECT_EQ(c.generator.seed, 7u);
  EXPECT_EQ(c.generator.offset, 12u);
  EXPECT_EQ(c.settings.at("lr"), "0.1");
  const auto a = model->state_dict(), b = other->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(testing::all_close(a[i].second, b[i].second, 0, 0)) << a[i].first;
  }
  EXPECT_EQ(sgd.state_dict().size(), other_sgd.state_dict().size());
  // PyTorch's names for the equivalent nn.Sequential.
  std::map<std::string, std::string> metadata;
  const auto tensors = read_tensors(path, &metadata);
  EXPECT_EQ(tensors[0].first, "0.weight");
  EXPECT_NE(nn::find_tensor(tensors, "1.running_mean"), nullptr);
  EXPECT_NE(nn::find_tensor(tensors, "1.num_batches_tracked"), nullptr);
  EXPECT_NE(nn::find_tensor(tensors, "13.weight"), nullptr);
  EXPECT_NE(nn::find_tensor(tensors, "optimizer.state.0.momentum_buffer"), nullptr);
  EXPECT_EQ(metadata.at("format"), "ferry-checkpoint-1");
  std::filesystem::remove(path);
  EXPECT_THROW(load_checkpoint(path, *other, nullptr), IoError);
}

// Every parameter and buffer of `actual` equals `expected`'s bit for bit (a resumed or replayed run against the
// unbroken one).
void expect_same_bits(const nn::Module& expected, const nn::Module& actual) {
  const auto a = expected.state_dict(), b = actual.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(testing::all_close(b[i].second, a[i].second, 0, 0)) << a[i].first;
}

TrainOptions quick_options(Device device) {
  TrainOptions o;
  o.device = device;
  o.epochs = 2;
  o.batch_size = 16;
  o.lr = 0.05;
  o.log_every = 5;
  o.progress_bar = false;
  return o;
}

TEST(Trainer, LearnsAndReadsBackOnlyAtLogSteps) {
  const Dataset train_set = quadrant_dataset(256, 10), test_set = quadrant_dataset(64, 11);
  manual_seed(0);
  auto model = make_fmnist_model();
  std::ostringstream log;
  TrainOptions o = quick_options(kSim0);
  const TrainResult r = train(*model, train_set, test_set, o, log);
  EXPECT_EQ(r.epochs, 2);
  EXPECT_EQ(r.steps, 32);
  EXPECT_LT(r.history.back().train_loss, r.history.front().train_loss) << log.str();
  EXPECT_GT(r.test_accuracy, 0.5) << log.str();
  // Syncs: one per log step (32 / 5 = 6), two per epoch end (loss, accuracy), one per test pass.
  EXPECT_EQ(r.syncs, 6 + 2 * 2 + 2) << log.str();
  // Resident data: the dataset crossed once (plus the per-epoch order), not every step.
  EXPECT_LT(r.bytes_host_to_device, 2 * (256 + 64) * 784 * 4);
  EXPECT_NE(log.str().find("epoch 2/2"), std::string::npos);
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.device(), kSim0);
}

// The confusion matrix counts every test sample once, its trace is evaluate_accuracy's count, and it is read back once;
// a model whose logits do not match the classes, or a label outside them, is refused.
TEST(Trainer, ConfusionMatrixAgreesWithTheAccuracyInOneRead) {
  const Dataset train_set = quadrant_dataset(128, 12), test_set = quadrant_dataset(50, 13);
  std::ostringstream log;
  TrainOptions o = quick_options(kSim0);
  o.epochs = 1;
  manual_seed(7);
  auto model = make_fmnist_model();
  const TrainResult r = train(*model, train_set, test_set, o, log);
  DataLoader loader(test_set, {.batch_size = 16, .shuffle = false, .device = kSim0});
  Ledger::global().clear();
  const Tensor confusion = confusion_matrix(*model, loader, 10);
  EXPECT_EQ(Ledger::global().totals().syncs, 1);
  EXPECT_EQ(confusion.device(), kCPU);
  ASSERT_EQ(confusion.shape(), (Shape{10, 10}));
  const auto cells = confusion.to_vector<std::int64_t>();
  std::int64_t total = 0, right = 0;
  for (std::int64_t i = 0; i < 100; ++i) total += cells[static_cast<std::size_t>(i)];
  for (std::int64_t i = 0; i < 10; ++i) right += cells[static_cast<std::size_t>(i * 11)];
  EXPECT_EQ(total, 50);
  EXPECT_DOUBLE_EQ(static_cast<double>(right) / 50, r.test_accuracy);
  for (std::int64_t label = 4; label < 10; ++label)  // the quadrant data has labels 0-3 only
    for (std::int64_t guess = 0; guess < 10; ++guess) EXPECT_EQ(cells[static_cast<std::size_t>(label * 10 + guess)], 0);
  EXPECT_THROW(confusion_matrix(*model, loader, 4), ShapeMismatch);  // 10 logits
  Dataset bad = quadrant_dataset(8, 14);
  bad.labels.fill_(12);
  DataLoader bad_loader(bad, {.batch_size = 8, .shuffle = false, .device = kSim0});
  try {
    confusion_matrix(*model, bad_loader, 10);
    ADD_FAILURE() << "label 12 of 10 classes was counted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of"), std::string::npos) << e.what();
  }
}

// ferry train with the step captured as a graph (--graphs on; sim records the capture as CUDA would) trains to
// the same parameters, bit for bit, with the same host syncs: the shorter last batch of each epoch runs eagerly.
// With SGD and with AdamW (capturable: its step counts and learning rate on the device).
// With default settings: the model's convolutions (oneDNN) and BatchNorm + ReLU + pooling tails are library calls
// that a capture records. A build without oneDNN runs large convolutions as host loops eagerly, which a capture
// cannot record: there both runs take the backend's kernels.
TEST(Trainer, StepGraphGivesTheEagerLoopsParametersBitForBit) {
  const Dataset train_set = quadrant_dataset(100, 30), test_set = quadrant_dataset(16, 31);  // 6 x 16 + 4 per epoch
  std::ostringstream log;
  if (nn::functional::onednn_version().empty()) nn::functional::set_fused_host_kernels(false);
  for (const std::string optimizer : {"sgd", "adamw"}) {
  SCOPED_TRACE(optimizer);
  TrainOptions o = quick_options(kSim0);
  o.optimizer = optimizer;
  if (optimizer == "adamw") o.lr = 1e-3;
  o.graphs = "off";
  manual_seed(2);
  auto eager = make_fmnist_model();
  const TrainResult a = train(*eager, train_set, test_set, o, log);
  o.graphs = "on";
  manual_seed(2);
  auto graphed = make_fmnist_model();
  const TrainResult b = train(*graphed, train_set, test_set, o, log);
  EXPECT_EQ(a.graph_replays, 0);
  EXPECT_EQ(b.graph_replays, 2 * 6 - 2) << b.graph;  // two warm-up steps, then every full batch
  EXPECT_GT(b.graph_operations, 50) << b.graph;
  EXPECT_EQ(a.syncs, b.syncs);
  EXPECT_EQ(a.loss_curve, b.loss_curve);
  ASSERT_EQ(a.history.size(), b.history.size());
  for (std::size_t e = 0; e < a.history.size(); ++e) {
    EXPECT_EQ(a.history[e].train_loss, b.history[e].train_loss);
    EXPECT_EQ(a.history[e].train_accuracy, b.history[e].train_accuracy);
    EXPECT_EQ(a.history[e].test_accuracy, b.history[e].test_accuracy);
  }
  expect_same_bits(*eager, *graphed);
  EXPECT_THROW({ o.graphs = "sometimes"; train(*graphed, train_set, test_set, o, log); }, InvalidArgument);
  }
  nn::functional::set_fused_host_kernels(true);
}

// A run whose AdamW step is a graph (capturable: its step counts in the checkpoint are the device's) stopped after 9
// steps and resumed with the graph again ends on the straight run's parameters, bit for bit.
TEST(Trainer, CapturedAdamWResumesBitForBit) {
  const Dataset train_set = quadrant_dataset(100, 32), test_set = quadrant_dataset(16, 33);  // 7 steps an epoch
  std::ostringstream log;
  nn::functional::set_fused_host_kernels(false);  // the kernels a capture records, in every run
  TrainOptions o = quick_options(kSim0);
  o.optimizer = "adamw";
  o.lr = 1e-3;
  o.graphs = "on";
  manual_seed(6);
  auto straight = make_fmnist_model();
  EXPECT_GT(train(*straight, train_set, test_set, o, log).graph_replays, 0);
  TrainOptions part = o;
  part.max_steps = 9;  // into the second epoch
  part.checkpoint_path = temp_path("adamw_graph_resume.safetensors");
  manual_seed(6);
  auto first = make_fmnist_model();
  train(*first, train_set, test_set, part, log);
  TrainOptions rest = o;
  rest.resume_path = part.checkpoint_path;
  auto resumed = make_fmnist_model();
  EXPECT_EQ(train(*resumed, train_set, test_set, rest, log).steps, 14);
  expect_same_bits(*straight, *resumed);
  std::filesystem::remove(part.checkpoint_path);
  nn::functional::set_fused_host_kernels(true);
}

// --accumulate K: each batch in K micro-batches (16 = 6 + 5 + 5; the last batch of 4 = 2 + 1 + 1), their gradients
// summed with each loss weighted by its share: without BatchNorm that is the whole batch's step, to rounding.
TEST(Trainer, AccumulatedMicroBatchesTakeTheWholeBatchesStep) {
  const Dataset train_set = quadrant_dataset(100, 40), test_set = quadrant_dataset(16, 41);  // 6 x 16 + 4
  std::ostringstream log;
  TrainOptions o = quick_options(kCPU);
  o.epochs = 1;
  o.log_every = 2;
  o.checkpoint_path = temp_path("accumulate.safetensors");
  manual_seed(3);
  auto whole = make_mlp_model();
  const TrainResult a = train(*whole, train_set, test_set, o, log);
  o.accumulate = 3;
  manual_seed(3);
  auto pieces = make_mlp_model();
  const TrainResult b = train(*pieces, train_set, test_set, o, log);
  EXPECT_NE(log.str().find("gradient accumulation: each step's 16 images in 3 micro-batches of 5-6, their gradients "
                           "summed before the update"), std::string::npos) << log.str();
  EXPECT_EQ(b.steps, 7);
  EXPECT_EQ(a.syncs, b.syncs) << "the micro-batches added a host read";
  const auto sa = whole->state_dict(), sb = pieces->state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(testing::all_close(sb[i].second, sa[i].second, 1e-4, 1e-6)) << sa[i].first;
    EXPECT_FALSE(testing::all_close(sb[i].second, sa[i].second, 0, 0)) << sa[i].first << ": the same bits (no split?)";
  }
  ASSERT_EQ(a.loss_curve.size(), b.loss_curve.size());
  for (std::size_t i = 0; i < a.loss_curve.size(); ++i)
    EXPECT_NEAR(b.loss_curve[i].second, a.loss_curve[i].second, 1e-5);
  EXPECT_NEAR(b.history[0].train_loss, a.history[0].train_loss, 1e-5);
  EXPECT_EQ(b.history[0].train_accuracy, a.history[0].train_accuracy);
  EXPECT_EQ(read_checkpoint_contents(o.checkpoint_path).settings.at("accumulate"), "3");
  std::filesystem::remove(o.checkpoint_path);

  o.checkpoint_path.clear();
  for (const std::int64_t bad : {0, 17}) {
    o.accumulate = bad;
    try {
      train(*pieces, train_set, test_set, o, log);
      ADD_FAILURE() << "--accumulate " << bad << " with batches of 16 was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad == 0 ? "--accumulate must be at least 1, got 0"
                                                    : "--accumulate 17 splits each step's 16 images into that many "
                                                      "micro-batches: it can be at most 16"),
                std::string::npos) << e.what();
    }
  }
}

// --warmup-steps N: lr (step + 1) / N over the first N steps, then the cosine over the steps after them (or the
// constant rate); without a warmup the cosine of the whole run, as before.
TEST(Trainer, WarmupRampsTheRateThenTheScheduleTakesOver) {
  TrainOptions o;
  o.lr = 0.1;
  o.warmup_steps = 4;
  std::vector<double> rates;
  for (std::int64_t step = 0; step < 10; ++step) rates.push_back(scheduled_learning_rate(o, step, 10));
  const std::vector<double> expected = {0.025, 0.05, 0.075, 0.1, 0.1, 0.1 * 0.5 * (1 + std::cos(M_PI / 6)),
                                        0.1 * 0.5 * (1 + std::cos(M_PI * 2 / 6)), 0.05,
                                        0.1 * 0.5 * (1 + std::cos(M_PI * 4 / 6)), 0.1 * 0.5 * (1 + std::cos(M_PI * 5 / 6))};
  for (std::size_t i = 0; i < rates.size(); ++i) EXPECT_NEAR(rates[i], expected[i], 1e-15) << "step " << i;
  o.schedule = "constant";
  EXPECT_EQ(scheduled_learning_rate(o, 1, 10), 0.05);
  EXPECT_EQ(scheduled_learning_rate(o, 9, 10), 0.1);
  o.warmup_steps = 0;
  o.schedule = "cosine";
  EXPECT_EQ(scheduled_learning_rate(o, 0, 10), 0.1);
  EXPECT_NEAR(scheduled_learning_rate(o, 5, 10), 0.05, 1e-16);
  o.warmup_steps = 20;  // longer than the run: a ramp that never ends
  EXPECT_EQ(scheduled_learning_rate(o, 9, 10), 0.05);
  o.warmup_steps = -1;
  EXPECT_THROW(check_train_options(o), InvalidArgument);
}

// --clip-grad-norm: the norm before clipping is logged with the loss in the same read (no more syncs); a bound far
// above it scales by exactly 1 (the unclipped run's bits), one below it changes the run.
TEST(Trainer, ClipGradNormLogsTheNormAndBoundsTheUpdate) {
  const Dataset train_set = quadrant_dataset(64, 44), test_set = quadrant_dataset(16, 45);
  std::ostringstream log;
  TrainOptions o = quick_options(kSim0);
  o.epochs = 1;
  o.log_every = 1;
  manual_seed(6);
  auto plain = make_fmnist_model();
  const TrainResult a = train(*plain, train_set, test_set, o, log);
  o.clip_grad_norm = 1e9;
  manual_seed(6);
  auto loose = make_fmnist_model();
  const TrainResult b = train(*loose, train_set, test_set, o, log);
  expect_same_bits(*plain, *loose);
  EXPECT_EQ(a.syncs, b.syncs);
  EXPECT_TRUE(a.grad_norms.empty());
  ASSERT_EQ(b.grad_norms.size(), 4u);
  for (const double n : b.grad_norms) EXPECT_TRUE(n > 0 && std::isfinite(n)) << n;
  EXPECT_NE(log.str().find("grad norm "), std::string::npos) << log.str();
  o.clip_grad_norm = b.grad_norms.front() / 4;  // every step clipped
  manual_seed(6);
  auto tight = make_fmnist_model();
  const TrainResult c = train(*tight, train_set, test_set, o, log);
  EXPECT_EQ(c.grad_norms.front(), b.grad_norms.front());  // measured before clipping
  EXPECT_FALSE(testing::all_close(tight->parameters()[0], plain->parameters()[0], 1e-3, 0));
  o.clip_grad_norm = -1;
  EXPECT_THROW(train(*tight, train_set, test_set, o, log), InvalidArgument);
}

// Accumulating steps are captured as one graph (K forwards and backwards, the clipping, one update) and replayed to
// the eager bits;
// --resume of such a run continues bit for bit.
TEST(Trainer, AccumulatingStepsCaptureAsAGraphAndResumeBitForBit) {
  const Dataset train_set = quadrant_dataset(100, 42), test_set = quadrant_dataset(16, 43);
  std::ostringstream log;
  nn::functional::set_fused_host_kernels(false);  // the kernels a capture records, in both runs
  TrainOptions o = quick_options(kSim0);
  o.accumulate = 2;
  o.clip_grad_norm = 0.5;  // the clipping's ops are in the graph too
  o.graphs = "off";
  manual_seed(4);
  auto eager = make_fmnist_model();
  train(*eager, train_set, test_set, o, log);
  o.graphs = "on";
  manual_seed(4);
  auto graphed = make_fmnist_model();
  const TrainResult g = train(*graphed, train_set, test_set, o, log);
  EXPECT_EQ(g.graph_replays, 2 * 6 - 2) << g.graph;
  expect_same_bits(*eager, *graphed);
  nn::functional::set_fused_host_kernels(true);

  TrainOptions part = quick_options(kCPU);
  part.accumulate = 4;
  manual_seed(5);
  auto straight = make_fmnist_model();
  train(*straight, train_set, test_set, part, log);
  part.max_steps = 9;  // into the second epoch
  part.checkpoint_path = temp_path("accumulate_resume.safetensors");
  manual_seed(5);
  auto first = make_fmnist_model();
  train(*first, train_set, test_set, part, log);
  TrainOptions rest = quick_options(kCPU);
  rest.accumulate = 4;
  rest.resume_path = part.checkpoint_path;
  auto resumed = make_fmnist_model();
  EXPECT_EQ(train(*resumed, train_set, test_set, rest, log).steps, 14);
  expect_same_bits(*straight, *resumed);
  std::filesystem::remove(part.checkpoint_path);
}

// --resume continues bit for bit: N steps straight equal k steps, a checkpoint, then N - k more.
// With SGD and with AdamW (its moments and host step counts in the checkpoint).
TEST(Trainer, ResumeIsBitForBit) {
  for (const std::string optimizer : {"sgd", "adamw"}) {
  SCOPED_TRACE(optimizer);
  const Dataset train_set = quadrant_dataset(96, 20), test_set = quadrant_dataset(16, 21);
  std::ostringstream log;
  TrainOptions o = quick_options(kCPU);
  o.epochs = 2;  // 12 steps in all
  o.optimizer = optimizer;
  if (optimizer == "adamw") o.lr = 1e-3;
  manual_seed(1);
  auto straight = make_fmnist_model();
  train(*straight, train_set, test_set, o, log);

  const std::string path = temp_path("resume.safetensors");
  manual_seed(1);
  auto first = make_fmnist_model();
  TrainOptions part = o;
  part.max_steps = 8;  // stops mid second epoch
  part.checkpoint_path = path;
  train(*first, train_set, test_set, part, log);
  manual_seed(12345);  // whatever the process did in between
  auto resumed = make_fmnist_model();
  TrainOptions rest = o;
  rest.resume_path = path;
  const TrainResult r = train(*resumed, train_set, test_set, rest, log);
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(r.steps_run, 4);
  expect_same_bits(*straight, *resumed);
  std::filesystem::remove(path);
  }
}

// --optimizer adamw learns; its weight decay is on the weight matrices and kernels only (group 0), none on biases and
// BatchNorm (group 1), as timm and nanoGPT.
TEST(Trainer, AdamWLearnsWithoutDecayOnBiasesAndNorms) {
  const Dataset train_set = quadrant_dataset(96, 20), test_set = quadrant_dataset(64, 21);
  std::ostringstream log;
  TrainOptions o = quick_options(kCPU);
  o.epochs = 3;
  o.optimizer = "adamw";
  o.lr = 3e-3;
  o.weight_decay = 0.05;
  manual_seed(1);
  auto model = make_fmnist_model();
  const TrainResult r = train(*model, train_set, test_set, o, log);
  EXPECT_GT(r.test_accuracy, 0.5) << log.str();  // four classes: chance is 0.25

  const auto optimizer = make_train_optimizer(o, *model, false);
  ASSERT_EQ(optimizer->group_count(), 2u);
  EXPECT_EQ(optimizer->group_weight_decay(0), 0.05);
  EXPECT_EQ(optimizer->group_weight_decay(1), 0.0);
  for (const Tensor& p : optimizer->group_parameters(0)) EXPECT_GE(p.dim(), 2);
  for (const Tensor& p : optimizer->group_parameters(1)) EXPECT_EQ(p.dim(), 1);
  EXPECT_EQ(optimizer->parameters().size(), model->parameters().size());
  EXPECT_NE(dynamic_cast<optim::AdamW*>(optimizer.get()), nullptr);
  o.optimizer = "sgd";
  EXPECT_NE(dynamic_cast<optim::SGD*>(make_train_optimizer(o, *model, false).get()), nullptr);
}

// The epoch a resume continues reports the loss and accuracy of all its batches, as the unbroken run does (the
// checkpoint keeps the epoch's running sums); one that ran part of an epoch only has no seconds per epoch (NaN,
// null in --json) rather than 0.
TEST(Trainer, ResumedEpochReportsTheUnbrokenRunsLossAndAccuracy) {
  const Dataset train_set = quadrant_dataset(96, 20), test_set = quadrant_dataset(16, 21);
  std::ostringstream log;
  TrainOptions o = quick_options(kCPU);
  o.epochs = 2;  // 6 steps per epoch
  manual_seed(1);
  auto straight_model = make_fmnist_model();
  const TrainResult straight = train(*straight_model, train_set, test_set, o, log);
  ASSERT_EQ(straight.history.size(), 2u);

  const std::string path = temp_path("sums.safetensors");
  manual_seed(1);
  auto first = make_fmnist_model();
  TrainOptions part = o;
  part.max_steps = 9;  // 3 steps into the second epoch
  part.checkpoint_path = path;
  const TrainResult stopped = train(*first, train_set, test_set, part, log);
  EXPECT_EQ(stopped.history.size(), 1u);
  EXPECT_FALSE(std::isnan(stopped.seconds_per_epoch));  // the first epoch ran whole
  auto resumed_model = make_fmnist_model();
  TrainOptions rest = o;
  rest.resume_path = path;
  const TrainResult resumed = train(*resumed_model, train_set, test_set, rest, log);
  ASSERT_EQ(resumed.history.size(), 1u);
  EXPECT_EQ(resumed.history[0].epoch, 2);
  EXPECT_EQ(resumed.history[0].train_loss, straight.history[1].train_loss);  // bit for bit: the same sums
  EXPECT_EQ(resumed.history[0].train_accuracy, straight.history[1].train_accuracy);
  EXPECT_EQ(resumed.history[0].test_accuracy, straight.history[1].test_accuracy);
  EXPECT_TRUE(std::isnan(resumed.seconds_per_epoch)) << resumed.seconds_per_epoch;  // no whole epoch in this call
  EXPECT_EQ(resumed.steps_run, 3);
  std::filesystem::remove(path);
}

// A loss that goes non-finite between log steps stops a run that ends there (--max-steps, a stop request) before its
// checkpoint is written: the steps since the last read-back are read once at the stop.
TEST(Trainer, NonFiniteLossBetweenLogStepsStopsBeforeTheFinalCheckpoint) {
  const Dataset train_set = quadrant_dataset(96, 20), test_set = quadrant_dataset(16, 21);
  std::ostringstream log;
  TrainOptions o = quick_options(kCPU);
  o.log_every = 100;  // no log step in the run
  o.max_steps = 3;
  o.lr = 1e37;  // overflows float32 within a step or two
  o.schedule = "constant";
  o.checkpoint_path = temp_path("nan-stop.safetensors");
  std::filesystem::remove(o.checkpoint_path);
  manual_seed(1);
  auto model = make_fmnist_model();
  try {
    train(*model, train_set, test_set, o, log);
    ADD_FAILURE() << "a run whose loss went non-finite stopped without an error:\n" << log.str();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("by step 3"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(o.checkpoint_path)) << "the damaged parameters were saved";
}

// A log that does `action` once, when `text` has been written to it: something happens mid-run at a point that
// does not depend on timing (a stop request, as ferry train's SIGINT handler makes; a copy of the checkpoint).
class WhenLogged : public std::stringbuf {
 public:
  WhenLogged(std::string text, std::function<void()> action) : text_(std::move(text)), action_(std::move(action)) {}

 protected:
  int sync() override {
    if (action_ && str().find(text_) != std::string::npos) std::exchange(action_, nullptr)();
    return 0;
  }

 private:
  std::string text_;
  std::function<void()> action_;
};

// A stop request (Ctrl-C, SIGTERM) ends the run after the step in progress with a checkpoint there, and --resume
// continues bit for bit: a stop mid-epoch, and one after an epoch's last step (where the resumed run has no step
// left in that epoch: once it failed with "the mean training loss of epoch 1 is nan").
TEST(Trainer, StopRequestCheckpointsWhereItStoppedAndResumeIsBitForBit) {
  const Dataset train_set = quadrant_dataset(96, 24), test_set = quadrant_dataset(16, 25);
  TrainOptions o = quick_options(kCPU);
  o.epochs = 3;  // 6 steps per epoch, 18 in all
  o.log_every = 1;
  std::ostringstream quiet;
  manual_seed(3);
  auto straight = make_fmnist_model();
  train(*straight, train_set, test_set, o, quiet);

  // The loss of step k is logged once step k + 1 is queued; the request is seen before step k + 2.
  for (const auto& [logged, stop_at] : {std::pair<std::string, std::int64_t>{"epoch 2 step 2/6", 9},
                                        std::pair<std::string, std::int64_t>{"epoch 1 step 5/6", 6}}) {
    SCOPED_TRACE(logged);
    const std::string path = temp_path("stopped.safetensors");
    std::atomic<int> request{0};
    WhenLogged buffer(logged, [&] { request = 15; });
    std::ostream log(&buffer);
    log << std::unitbuf;  // sync after every write
    TrainOptions part = o;
    part.checkpoint_path = path;
    part.stop_request = &request;
    manual_seed(3);
    auto first = make_fmnist_model();
    const TrainResult stopped = train(*first, train_set, test_set, part, log);
    EXPECT_EQ(stopped.stopped_by, 15);
    EXPECT_EQ(stopped.steps, stop_at);
    EXPECT_NE(buffer.str().find("stopped on request (signal 15) after " + std::to_string(stop_at) + " steps"),
              std::string::npos)
        << buffer.str();
    auto probe = make_fmnist_model();
    const CheckpointContents written = load_checkpoint(path, *probe, nullptr);
    EXPECT_EQ(written.progress.global_step, stop_at);
    EXPECT_EQ(written.progress.epoch * 6 + written.progress.batch_in_epoch, stop_at);

    manual_seed(999);
    auto resumed = make_fmnist_model();
    TrainOptions rest = o;
    rest.resume_path = path;
    std::ostringstream rest_log;
    const TrainResult r = train(*resumed, train_set, test_set, rest, rest_log);
    EXPECT_EQ(r.steps, 18);
    EXPECT_EQ(r.stopped_by, 0);
    EXPECT_EQ(r.epochs, 3);
    expect_same_bits(*straight, *resumed);
    std::filesystem::remove(path);
  }
}

// --checkpoint-every: the checkpoint of step 5, taken from the folder while the run goes on (as a kill -9 would
// leave it), resumes to the unbroken run's parameters bit for bit.
TEST(Trainer, CheckpointEveryNStepsResumesBitForBit) {
  const Dataset train_set = quadrant_dataset(96, 31), test_set = quadrant_dataset(16, 32);
  TrainOptions o = quick_options(kCPU);  // 6 steps per epoch, 12 in all
  o.log_every = 1;
  std::ostringstream quiet;
  manual_seed(6);
  auto straight = make_fmnist_model();
  train(*straight, train_set, test_set, o, quiet);

  const std::string path = temp_path("every.safetensors"), kept = temp_path("every_step5.safetensors");
  TrainOptions every = o;
  every.checkpoint_path = path;
  every.checkpoint_every = 5;
  // Step 5's loss is logged while step 6 runs: the file then holds step 5 (step 6 is not a multiple of 5).
  WhenLogged buffer("epoch 1 step 5/6", [&] { std::filesystem::copy_file(path, kept); });
  std::ostream log(&buffer);
  log << std::unitbuf;
  manual_seed(6);
  auto first = make_fmnist_model();
  train(*first, train_set, test_set, every, log);
  ASSERT_TRUE(std::filesystem::exists(kept)) << buffer.str();
  EXPECT_EQ(read_checkpoint_contents(kept).progress.global_step, 5);

  manual_seed(77);
  auto resumed = make_fmnist_model();
  TrainOptions rest = o;
  rest.resume_path = kept;
  EXPECT_EQ(train(*resumed, train_set, test_set, rest, quiet).steps, 12);
  expect_same_bits(*straight, *resumed);
  std::filesystem::remove(path);
  std::filesystem::remove(kept);
}

// A request that comes during an epoch's test pass stops the run at that epoch's end, its checkpoint already written.
TEST(Trainer, StopRequestAtAnEpochEndStopsBeforeTheNextEpoch) {
  const Dataset train_set = quadrant_dataset(48, 26), test_set = quadrant_dataset(16, 27);
  TrainOptions o = quick_options(kCPU);
  o.epochs = 4;  // 3 steps per epoch
  o.log_every = 100;
  std::atomic<int> request{0};
  WhenLogged buffer("epoch 2/4", [&] { request = 2; });
  std::ostream log(&buffer);
  log << std::unitbuf;
  o.stop_request = &request;
  manual_seed(4);
  auto model = make_fmnist_model();
  const TrainResult r = train(*model, train_set, test_set, o, log);
  EXPECT_EQ(r.stopped_by, 2);
  EXPECT_EQ(r.epochs, 2);
  EXPECT_EQ(r.steps, 6);
  EXPECT_NE(buffer.str().find("stopped on request (signal 2) at the end of epoch 2"), std::string::npos) << buffer.str();
}

// The run's settings are in the checkpoint exactly (a learning rate of 0.0123456789 reads back as itself, not as
// std::to_string's "0.012346"), read without building a model; a run resumed within an epoch must cut the same
// batches from the same data, or it stops with the numbers of both.
TEST(Trainer, CheckpointHoldsTheRunsSettingsAndAMidEpochResumeNeedsTheSameBatches) {
  const Dataset train_set = quadrant_dataset(64, 28), test_set = quadrant_dataset(16, 29);
  std::ostringstream log;
  const std::string path = temp_path("settings.safetensors");
  TrainOptions part = quick_options(kCPU);  // batch 16: 4 steps per epoch
  part.lr = 0.0123456789;
  part.max_steps = 3;
  part.checkpoint_path = path;
  manual_seed(5);
  auto model = make_fmnist_model();
  train(*model, train_set, test_set, part, log);
  const CheckpointContents c = read_checkpoint_contents(path);
  EXPECT_EQ(c.progress.global_step, 3);
  EXPECT_EQ(c.progress.batch_in_epoch, 3);
  EXPECT_EQ(std::stod(c.settings.at("lr")), 0.0123456789);
  EXPECT_EQ(c.settings.at("batch"), "16");
  EXPECT_EQ(c.settings.at("train_images"), "64");
  EXPECT_EQ(c.settings.at("test_images"), "16");
  EXPECT_EQ(c.settings.at("model"), "fmnist");

  TrainOptions rest = quick_options(kCPU);
  rest.resume_path = path;
  rest.batch_size = 32;
  auto resumed = make_fmnist_model();
  try {
    train(*resumed, train_set, test_set, rest, log);
    ADD_FAILURE() << "a resume with other batches went on";
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("after 3 batches of 16 over 64 training images; this run has batches of 32 over 64"),
              std::string::npos) << message;
  }
  rest.batch_size = 16;
  EXPECT_THROW(train(*resumed, quadrant_dataset(48, 30), test_set, rest, log), InvalidArgument);  // other data
  EXPECT_EQ(train(*resumed, train_set, test_set, rest, log).steps, 8);
  std::filesystem::remove(path);
}

// --deterministic is written into the checkpoint's settings, and a resumed run takes it from there (on cuda that
// is what makes the continuation bit for bit); the process-wide switch is put back after each run.
TEST(Trainer, ResumeTakesDeterministicAlgorithmsFromTheCheckpoint) {
  const Dataset train_set = quadrant_dataset(48, 22), test_set = quadrant_dataset(16, 23);
  std::ostringstream log;
  const std::string path = temp_path("deterministic.safetensors");
  TrainOptions part = quick_options(kCPU);
  part.max_steps = 2;
  part.deterministic = true;
  part.checkpoint_path = path;
  manual_seed(2);
  auto first = make_fmnist_model();
  EXPECT_TRUE(train(*first, train_set, test_set, part, log).deterministic);
  EXPECT_FALSE(deterministic_algorithms()) << "the run's setting outlived it";
  auto probe = make_fmnist_model();
  EXPECT_EQ(load_checkpoint(path, *probe, nullptr).settings.at("deterministic"), "true");

  TrainOptions rest = quick_options(kCPU);
  rest.resume_path = path;
  auto resumed = make_fmnist_model();
  const TrainResult r = train(*resumed, train_set, test_set, rest, log);
  EXPECT_TRUE(r.deterministic);
  EXPECT_NE(log.str().find("deterministic algorithms: on, as in the run that wrote the checkpoint"), std::string::npos)
      << log.str();
  EXPECT_FALSE(deterministic_algorithms());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ferry
