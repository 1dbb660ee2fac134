// train_command.cpp — `ferry train`: the fmnist CNN on Fashion-MNIST on the best device, with the
// ledger's account of where the time went. `ferry eval` and `ferry inspect` read its checkpoints.
#include <fmt/format.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/checkpoint.h"
#include "ferry/cost_model.h"
#include "ferry/dist/process_group.h"
#include "ferry/factories.h"
#include "ferry/idx.h"
#include "ferry/ledger.h"
#include "ferry/random.h"
#include "ferry/report.h"
#include "ferry/safetensors.h"
#include "ferry/trainer.h"
#include "plot.h"

namespace {

struct TrainArgs {
  std::string device = "auto";
  std::string placement = "resident";
  std::string data = ferry::kDefaultFashionMnistDir;
  std::string plot_path;
  std::string trace_path;
  std::int64_t limit_train = -1, limit_test = -1;  // -1: all images (load_fashion_mnist's "all"); else >= 1
  bool json = false;
  bool quiet = false;
  bool ddp = false;
  std::string ddp_backend = "auto";
  double bucket_mb = 25;        // MiB
  double ddp_timeout_s = ferry::dist::kDefaultTimeoutSeconds;
  std::string allreduce_dtype = "float32";
  ferry::TrainOptions options;
};

// Ctrl-C (SIGINT) or a scheduler's SIGTERM during `ferry train`: the first asks the loop to stop after the step in
// progress and to write the checkpoint there (TrainOptions::stop_request); the same signal again, a second or more
// later, ends the process at once. Repeats within that second are the same request delivered twice: `timeout`, for
// one, forwards a signal to its command and then to its whole process group.
std::atomic<int> stop_request{0};
std::atomic<std::int64_t> first_signal_ns{0};  // CLOCK_MONOTONIC of the first signal; 0: none yet
constexpr std::int64_t kRepeatIgnoredNs = 1'000'000'000;

extern "C" void ask_training_to_stop(int signal) {  // async-signal-safe: clock_gettime, write, signal, raise
  timespec now {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const std::int64_t ns = static_cast<std::int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
  const std::int64_t first = first_signal_ns.load(std::memory_order_relaxed);
  if (first != 0) {
    if (ns - first < kRepeatIgnoredNs) return;
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  first_signal_ns.store(ns, std::memory_order_relaxed);
  stop_request.store(signal, std::memory_order_relaxed);
  static const char message[] = "\nferry: stopping after this step (again to quit at once)\n";
  const ssize_t ignored = write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
}

// Installs the handler for SIGINT and SIGTERM while it lives; restores what was there before.
class StopOnSignal {
 public:
  StopOnSignal() {
    struct sigaction action {};
    action.sa_handler = ask_training_to_stop;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopOnSignal() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

std::string signal_name(int signal) {
  if (signal == SIGINT) return "SIGINT (Ctrl-C)";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

// --resume: each option this command line leaves out takes the value of the run that wrote the checkpoint, so
// `ferry train --resume F --checkpoint F` alone continues that run. An option given with another value is used,
// and named in a note (the run then differs from the one that stopped). Returns the lines to print.
std::vector<std::string> take_run_settings(const CLI::App& cmd, TrainArgs& a, const ferry::CheckpointContents& c) {
  std::vector<std::string> taken, notes;
  auto& o = a.options;
  // valid(stored): "" when the stored value is one the flag accepts, else what the flag wants. A stored value that
  // is not is a damaged file (exit 1), not a bad command line: the message says where it came from.
  auto apply = [&]<typename T>(const char* flag, const char* key, T& value, auto valid) {
    const auto it = c.settings.find(key);
    if (it == c.settings.end()) return;  // an older checkpoint, without this setting
    T stored{};
    if constexpr (std::is_same_v<T, std::string>) {
      stored = it->second;
    } else {
      const char* first = it->second.data();
      const char* last = first + it->second.size();
      const auto [end, error] = std::from_chars(first, last, stored);
      FERRY_CHECK(error == std::errc() && end == last, FormatError, "Checkpoint '",
                  ferry::detail::printable(o.resume_path), "': its setting '", key, "' is not a number: '",
                  ferry::detail::printable(it->second), "'");
    }
    if (const std::string wanted = valid(stored); !wanted.empty()) {
      throw ferry::FormatError(fmt::format("Checkpoint '{}': its setting '{}' is '{}', which {} does not take ({}); "
                                           "the file is damaged or was not written by ferry train",
                                           ferry::detail::printable(o.resume_path), key,
                                           ferry::detail::printable(it->second), flag, wanted));
    }
    if (cmd.count(flag) == 0) {
      value = stored;
      taken.push_back(fmt::format("{} {}", flag, ferry::detail::printable(it->second)));
    } else if (value != stored) {
      notes.push_back(fmt::format("note: {} {} is not the {} of the run that wrote {}: this run differs from it",
                                  flag, value, ferry::detail::printable(it->second), o.resume_path));
    }
  };
  const auto one_of = [](std::initializer_list<std::string_view> names) {
    return [names](const std::string& v) {
      std::string all;
      for (const auto name : names) {
        if (v == name) return std::string();
        all += (all.empty() ? "" : " | ") + std::string(name);
      }
      return all;
    };
  };
  const auto at_least_one = [](std::int64_t v) { return v >= 1 ? std::string() : std::string("a whole number >= 1"); };
  const auto at_least_zero = [](std::int64_t v) { return v >= 0 ? std::string() : std::string("a whole number >= 0"); };
  const auto positive = [](double v) { return v > 0 && std::isfinite(v) ? std::string() : std::string("a number > 0"); };
  const auto non_negative = [](double v) {
    return v >= 0 && std::isfinite(v) ? std::string() : std::string("a number >= 0");
  };
  const auto any = [](std::uint64_t) { return std::string(); };
  apply("--model", "model", o.model_name, one_of({"fmnist", "mlp"}));
  apply("--batch", "batch", o.batch_size, at_least_one);
  apply("--accumulate", "accumulate", o.accumulate, at_least_one);
  apply("--clip-grad-norm", "clip_grad_norm", o.clip_grad_norm, non_negative);
  apply("--epochs", "epochs", o.epochs, at_least_one);
  apply("--optimizer", "optimizer", o.optimizer, one_of({"sgd", "adamw"}));
  apply("--lr", "lr", o.lr, positive);
  apply("--momentum", "momentum", o.momentum, non_negative);
  apply("--weight-decay", "weight_decay", o.weight_decay, non_negative);
  apply("--schedule", "schedule", o.schedule, one_of({"cosine", "constant"}));
  apply("--warmup-steps", "warmup_steps", o.warmup_steps, at_least_zero);
  apply("--seed", "seed", o.seed, any);
  apply("--placement", "placement", a.placement, one_of({"resident", "prefetch", "per-step"}));
  apply("--limit-train", "train_images", a.limit_train, at_least_one);
  apply("--limit-test", "test_images", a.limit_test, at_least_one);
  // The weights fit one architecture: another --model cannot load them (a state-dict error listing every tensor).
  if (const auto it = c.settings.find("model"); it != c.settings.end() && it->second != o.model_name) {
    throw ferry::InvalidArgument(fmt::format("--model {} cannot resume '{}': it holds the {} model's weights (leave "
                                             "--model out to take it from the checkpoint)",
                                             ferry::detail::printable(o.model_name),
                                             ferry::detail::printable(o.resume_path),
                                             ferry::detail::printable(it->second)));
  }
  // The optimizer's state is one optimizer's (SGD's momentum buffers, AdamW's moments): another cannot take it on.
  // A checkpoint written before --optimizer existed holds SGD's.
  const auto written = c.settings.find("optimizer");
  const std::string written_optimizer = written == c.settings.end() ? "sgd" : written->second;
  if (written_optimizer != o.optimizer) {
    throw ferry::InvalidArgument(fmt::format("--optimizer {} cannot resume '{}': it holds {}'s state (leave "
                                             "--optimizer out to take it from the checkpoint)",
                                             ferry::detail::printable(o.optimizer),
                                             ferry::detail::printable(o.resume_path),
                                             ferry::detail::printable(written_optimizer)));
  }
  if (!taken.empty()) {
    std::string line = "the run's settings, from " + o.resume_path + ":";
    for (const auto& t : taken) line += " " + t;
    notes.insert(notes.begin(), line);
  }
  return notes;
}

// "1 step", "2 steps".
std::string steps_text(std::int64_t count) { return fmt::format("{} step{}", count, count == 1 ? "" : "s"); }

// A process that mpirun (Open MPI, or MPICH / Intel MPI through PMI) started as one of several ranks, without
// --ddp: each rank trains the whole model on all the data by itself. Said once, by the launcher's rank 0.
void warn_if_ranks_without_ddp() {
  const auto env_int = [](const char* name) {
    const char* text = std::getenv(name);
    return text != nullptr ? std::atoi(text) : -1;
  };
  int size = env_int("OMPI_COMM_WORLD_SIZE"), rank = env_int("OMPI_COMM_WORLD_RANK");
  if (size < 0) size = env_int("PMI_SIZE"), rank = env_int("PMI_RANK");
  if (size <= 1 || rank > 0) return;
  std::fprintf(stderr,
               "ferry: warning: started as one of %d ranks (mpirun) without --ddp: every rank trains the full model "
               "on all the data independently; add --ddp to train one model data-parallel\n",
               size);
  std::fflush(stderr);
}

// Data-parallel part of the report: what the all-reduces carried and cost, against Exercise 4.1's figure.
void print_ddp_report(const ferry::TrainResult& r, std::FILE* out) {
  const auto plan = ferry::cost::allreduce_bytes(r.parameters, r.allreduce_dtype, r.world_size);
  const std::int64_t steps = std::max<std::int64_t>(r.steps, 1);
  const double ring_per_step = 2.0 * (r.world_size - 1) / r.world_size * static_cast<double>(r.gradient_bytes_per_step);
  const std::string dtype(ferry::dtype_name(r.allreduce_dtype));
  const std::size_t size = ferry::element_size(r.allreduce_dtype);
  fmt::print(out, "\nData-parallel over {} ranks ({} backend):\n", r.world_size, r.comm_backend);
  fmt::print(out, "  gradients  {} bytes all-reduced per step on each rank = P x {} bytes ({}), P = {} parameters\n",
             r.gradient_bytes_per_step, size, dtype, r.parameters);
  fmt::print(out, "  Exercise 4.1 (ferry plan allreduce --params {} --gpus {}{}): 2 x P x {} = {} bytes per iteration; "
                  "a ring sends 2(N-1)/N x P x {} = {:.0f} bytes from each rank\n",
             r.parameters, r.world_size, size == 4 ? "" : " --dtype " + dtype, size, plan.bytes, size,
             plan.bytes_ring_per_gpu);
  fmt::print(out, "  measured: a ring over these buckets sends {:.0f} bytes per step from each rank ({:.3f} x the plan)\n",
             ring_per_step, plan.bytes_ring_per_gpu > 0 ? ring_per_step / plan.bytes_ring_per_gpu : 0.0);
  fmt::print(out, "  ledger: {} collectives, {} bytes of payload, {:.2f} s launch to completion in all "
                  "(overlapping backward)\n",
             r.collectives, r.collective_bytes, r.collective_s);
  fmt::print(out, "  host waited {:.2f} s for gradients after backward ({:.1f} ms per step); replica checks passed: {}\n",
             r.t_comm_s, 1e3 * r.t_comm_s / static_cast<double>(steps), r.replica_checks);
  const double step_s = r.t_transfer_s + r.t_compute_s + r.t_sync_s + r.t_comm_s;
  const std::string advice =
      ferry::allreduce_advice(step_s > 0 ? r.t_comm_s / step_s : 0.0, r.gradient_bytes_per_step, r.allreduce_dtype);
  if (!advice.empty()) fmt::print(out, "  advice: {}\n", advice);
}

void print_report(const ferry::TrainResult& r, std::FILE* out) {
  const double total = r.t_transfer_s + r.t_compute_s + r.t_sync_s;
  auto pct = [&](double t) { return total > 0 ? 100.0 * t / total : 0.0; };
  fmt::print(out, "\nWhere the time went on {} ({}{}; the whole run, the model's move and the evaluations "
                  "included: {} host syncs, {} bytes host->device, {} bytes device->host):\n",
             r.device.str(), steps_text(r.steps_run), r.steps_run == r.steps ? "" : " in this run", r.syncs,
             r.bytes_host_to_device, r.bytes_device_to_host);
  fmt::print(out, "  transfer  {:8.2f} s  {:5.1f} %   (getting each batch onto the device)\n", r.t_transfer_s,
             pct(r.t_transfer_s));
  fmt::print(out, "  compute   {:8.2f} s  {:5.1f} %   (forward, backward, optimizer step)\n", r.t_compute_s,
             pct(r.t_compute_s));
  fmt::print(out, "  sync      {:8.2f} s  {:5.1f} %   (reading values back to the host)\n", r.t_sync_s, pct(r.t_sync_s));
  if (!r.graph.empty()) fmt::print(out, "  step graph: {}\n", r.graph);
  if (r.world_size > 1 || !r.comm_backend.empty()) {
    fmt::print(out, "  (data-parallel: compute excludes the {:.2f} s the host waited for the gradient all-reduce)\n",
               r.t_comm_s);
  }
  if (r.t_compute_s > 0 && !r.device.is_cpu()) {
    const double efficiency = ferry::cost::golden_rule(1.0, r.t_compute_s, std::max(r.t_transfer_s, 1e-12)).efficiency;
    fmt::print(out, "  Golden Rule: S_real = S / (1 + T_transfer / T_compute) = S x {:.3f}\n", efficiency);
    if (pct(r.t_transfer_s) > 10)
      fmt::print(out, "  advice: copies take {:.0f} % of the time: keep the dataset resident (--placement resident) "
                      "or prefetch from pinned memory\n", pct(r.t_transfer_s));
  }
}

// What rank 0 prints at the end (the JSON object, or the accuracy and the ledger's report), and the files asked for.
void print_results(const ferry::TrainResult& r, const TrainArgs& a, std::FILE* out) {
  if (!a.plot_path.empty()) write_training_plot(a.plot_path, r);
  if (!a.trace_path.empty()) write_trace_file(a.trace_path);
  if (a.json) {
    nlohmann::json epochs = nlohmann::json::array();
    for (const auto& e : r.history)
      epochs.push_back({{"epoch", e.epoch}, {"train_loss", e.train_loss}, {"train_accuracy", e.train_accuracy},
                        {"test_accuracy", e.test_accuracy}, {"seconds", e.seconds}});
    const nlohmann::json summary{{"device", r.device.str()}, {"epochs", r.epochs}, {"steps", r.steps},
                                 {"steps_run", r.steps_run}, {"accumulate", a.options.accumulate},
                                 {"test_accuracy", r.test_accuracy}, {"seconds_per_epoch", r.seconds_per_epoch},
                                 {"t_transfer_s", r.t_transfer_s}, {"t_compute_s", r.t_compute_s},
                                 {"t_sync_s", r.t_sync_s}, {"syncs", r.syncs},
                                 {"bytes_host_to_device", r.bytes_host_to_device},
                                 {"bytes_device_to_host", r.bytes_device_to_host},
                                 {"placement", a.placement}, {"history", epochs},
                                 {"world_size", r.world_size}, {"comm_backend", r.comm_backend},
                                 {"parameters", r.parameters},
                                 {"gradient_bytes_per_step", r.gradient_bytes_per_step},
                                 {"allreduce_dtype", ferry::dtype_name(r.allreduce_dtype)},
                                 {"collectives", r.collectives}, {"collective_bytes", r.collective_bytes},
                                 {"collective_s", r.collective_s}, {"t_comm_s", r.t_comm_s},
                                 {"replica_checks", r.replica_checks},
                                 {"graph_replays", r.graph_replays}, {"graph_operations", r.graph_operations},
                                 {"graph", r.graph}, {"deterministic", r.deterministic},
                                 {"stopped_by_signal", r.stopped_by}};
    fmt::print(out, "{}\n", summary.dump());
  } else {
    if (r.steps_run == 0 && r.history.empty()) {  // --resume of a run that had done its epochs: said above
      std::fflush(out);
      return;
    }
    if (r.history.empty()) {
      fmt::print(out, "\nno epoch ended in this run, so no test accuracy yet ({} on {})\n", steps_text(r.steps),
                 r.device.str());
    } else {
      fmt::print(out, "\n{} test accuracy {:.2f} %{}, {} on {}\n", r.epochs == a.options.epochs ? "final" : "latest",
                 100 * r.test_accuracy,
                 r.epochs == a.options.epochs ? "" : fmt::format(" (after epoch {} of {})", r.epochs, a.options.epochs),
                 std::isnan(r.seconds_per_epoch) ? std::string("no whole epoch in this run to time")
                                                 : fmt::format("{:.1f} s per epoch", r.seconds_per_epoch),
                 r.device.str());
    }
    if (!a.options.checkpoint_path.empty()) {
      const std::string& path = a.options.checkpoint_path;
      fmt::print(out, "checkpoint {} holds step {}: ferry eval --checkpoint {}{}\n", path, r.steps, path,
                 r.epochs < a.options.epochs ? "; ferry train --resume " + path + " --checkpoint " + path + " goes on"
                                             : std::string());
    }
    print_report(r, out);
    if (!r.comm_backend.empty()) print_ddp_report(r, out);
  }
  std::fflush(out);
}

// Data-parallel ranks must run the same training: the same samples in the same order, the same batch, model and
// schedule, the same collectives at the same steps. A rank given another --seed trains silently on the wrong
// samples; another --batch makes the ranks' collectives differ (a crash or a hang). So before training, every
// rank's settings are compared with one all_gather of a hash per setting; on a difference one more all_gather
// brings every rank's text of the first that differs, and every rank stops with the same line (exit 2).
void check_ranks_agree(ferry::dist::ProcessGroup& group, const std::vector<std::pair<std::string, std::string>>& settings) {
  if (group.world_size() == 1) return;
  const auto count = static_cast<std::int64_t>(settings.size());
  const int n = group.world_size();
  std::vector<std::int64_t> hashes;
  for (const auto& [name, value] : settings) {
    std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
    for (const unsigned char c : name + '=' + value) hash = (hash ^ c) * 0x100000001b3ull;
    hashes.push_back(static_cast<std::int64_t>(hash));
  }
  const auto gather = [&](const auto& mine, ferry::DType dtype, const char* label) {
    using T = typename std::decay_t<decltype(mine)>::value_type;
    const auto per_rank = static_cast<std::int64_t>(mine.size());
    const ferry::Tensor local = ferry::from_vector(mine, {per_rank}).to(group.device());
    const ferry::Tensor all = ferry::empty({n * per_rank}, {.device = group.device(), .dtype = dtype});
    group.all_gather(all, local, label);
    return all.cpu().template to_vector<T>();
  };
  const std::vector<std::int64_t> all = gather(hashes, ferry::DType::Int64, "ferry train settings");
  for (std::int64_t i = 0; i < count; ++i) {
    int differing = -1;
    for (int r = 1; r < n && differing < 0; ++r) {
      if (all[static_cast<std::size_t>(r * count + i)] != all[static_cast<std::size_t>(i)]) differing = r;
    }
    if (differing < 0) continue;
    constexpr std::size_t kTextBytes = 256;
    const std::string& value = settings[static_cast<std::size_t>(i)].second;
    std::vector<std::uint8_t> text(kTextBytes, 0);
    std::copy_n(value.begin(), std::min(value.size(), kTextBytes - 1), text.begin());
    const std::vector<std::uint8_t> texts = gather(text, ferry::DType::UInt8, "ferry train settings (values)");
    const auto text_of = [&](int r) {
      const char* begin = reinterpret_cast<const char*>(texts.data()) + static_cast<std::size_t>(r) * kTextBytes;
      return ferry::detail::printable(std::string(begin, strnlen(begin, kTextBytes)));
    };
    const std::string& name = settings[static_cast<std::size_t>(i)].first;
    throw ferry::InvalidArgument(fmt::format(
        "--ddp: the ranks were started with different settings: {} is {} on rank 0 but {} on rank {} (of {}); every "
        "rank must train with the same options and data",
        name, text_of(0), text_of(differing), differing, n));
  }
}

}  // namespace

void register_train_command(CLI::App& app) {
  static TrainArgs a;
  auto* cmd = app.add_subcommand(
      "train",
      "Train the fmnist CNN (3 x [Conv3x3, BatchNorm, ReLU, MaxPool], Linear 1152->10) on Fashion-MNIST.\n"
      "The data goes to the device once (--placement resident, the sheet's Exercise 3.2), the loss is read\n"
      "back only every --log-every steps (Exercise 5.1), and at the end the ledger says where the time went.\n"
      "Example: ferry train --device auto --epochs 5 --checkpoint fmnist.safetensors");
  auto& o = a.options;
  cmd->add_option("--device", a.device, "auto (cuda:0, else cpu, with a note saying why) | cpu | cuda[:N] | sim[:N]")
      ->capture_default_str();
  cmd->add_option("--epochs", o.epochs, "Passes over the 60000 training images")->capture_default_str()->check(whole_number_at_least(1));
  cmd->add_option("--batch", o.batch_size, "Images per step")->capture_default_str()->check(whole_number_at_least(1));
  cmd->add_option("--accumulate", o.accumulate,
                  "Gradient accumulation: run each step's batch as K micro-batches, forward and backward one at a\n"
                  "time, their gradients summed, then one update: the batch's step with the activation memory of\n"
                  "batch/K (BatchNorm normalizes each micro-batch on its own; with --ddp still one all-reduce per step)")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  cmd->add_option("--clip-grad-norm", o.clip_grad_norm,
                  "Scale the gradients before each update so that their joint 2-norm is at most this (PyTorch's\n"
                  "clip_grad_norm_, on the device: no extra sync); the norm is logged beside the loss. 0: off")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--optimizer", o.optimizer,
                  "sgd (momentum; L2 weight decay on every parameter) | adamw (decoupled weight decay on the weight\n"
                  "matrices and kernels only, none on biases and BatchNorm)")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate (default 0.05 with sgd, 0.001 with adamw)");
  cmd->add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay,
                  "Weight decay: L2 with sgd (default 0.0005), decoupled with adamw (default 0.01)");
  cmd->add_option("--schedule", o.schedule, "Learning rate schedule: cosine | constant")->capture_default_str();
  cmd->add_option("--warmup-steps", o.warmup_steps,
                  "Ramp the learning rate up linearly over the first N steps (lr (step + 1) / N), then the schedule\n"
                  "(cosine: over the steps after the warmup)")
      ->capture_default_str()
      ->check(whole_number_at_least(0));
  cmd->add_option("--seed", o.seed, "Seed for initialisation and shuffling")
      ->capture_default_str()
      ->check(whole_number_at_least(0));
  cmd->add_option("--log-every", o.log_every, "Steps between loss read-backs (each one is a host sync)")
      ->capture_default_str()->check(whole_number_at_least(1));
  cmd->add_option("--placement", a.placement,
                  "How batches reach the device: resident | prefetch | per-step (an accelerator's; the cpu has none)")
      ->capture_default_str();
  cmd->add_option("--graphs", o.graphs,
                  "Capture the step (forward, loss, backward, update) as one graph after two eager steps and\n"
                  "replay it (the learning rate, and AdamW's step count, are read on the device, so the schedule\n"
                  "goes on):\n"
                  "auto (on cuda: one launch instead of hundreds) | on (cuda or sim) | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--max-steps", o.max_steps, "Stop after this many steps in all (and checkpoint there, with --checkpoint)")
      ->check(whole_number_at_least(0));
  cmd->add_option("--checkpoint", o.checkpoint_path,
                  "Write a safetensors checkpoint at each epoch end, and where the run stops (--max-steps, or\n"
                  "Ctrl-C / SIGTERM: the first stops after the step in progress, exit status 130 / 143)");
  cmd->add_option("--checkpoint-every", o.checkpoint_every,
                  "Also write the checkpoint every N steps, so that a kill -9 or a crash loses at most N steps\n"
                  "(each write waits for the device and copies the model and optimizer state to the host)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--resume", o.resume_path,
                  "Continue the run that wrote a checkpoint, bit for bit: the options not given here take that\n"
                  "run's values (model, optimizer, batch, accumulate, clip-grad-norm, epochs, lr, momentum,\n"
                  "weight decay, schedule, warmup steps, seed, placement, image counts). On cuda bit for bit when\n"
                  "that run used --deterministic, which this one then does too.\n"
                  "Example: ferry train --resume run.safetensors --checkpoint run.safetensors");
  cmd->add_flag("--deterministic", o.deterministic,
                "Only algorithms that sum in a fixed order, chosen without timing: on cuda the same bits every run\n"
                "(cuDNN's heuristics instead of its timed search; no atomics); maybe slower. The cpu always is.\n"
                "Also FERRY_DETERMINISTIC=1");
  cmd->add_option("--metrics", o.metrics_path, "Append JSON lines per log step and per epoch");
  cmd->add_option("--plot", a.plot_path, "Write an SVG of the loss curve and accuracy per epoch");
  cmd->add_option("--trace", a.trace_path, "Write the ledger as Chrome trace-event JSON (Perfetto)");
  cmd->add_option("--data", a.data, "Folder with the Fashion-MNIST idx files (.gz, or uncompressed)")
      ->capture_default_str();
  cmd->add_option("--limit-train", a.limit_train, "Use only the first N training images (quick runs)")
      ->check(whole_number_at_least(1));
  cmd->add_option("--limit-test", a.limit_test, "Use only the first N test images")->check(whole_number_at_least(1));
  cmd->add_flag("--json", a.json,
                "Print one JSON object at the end (and nothing else on stdout); test_accuracy is null when no epoch\n"
                "ended in this run, seconds_per_epoch when no whole epoch ran in it");
  cmd->add_option("--model", o.model_name, "fmnist (the CNN) | mlp (784-1024-1024-10, no BatchNorm)")
      ->capture_default_str();
  cmd->add_flag("--ddp", a.ddp,
                "Data-parallel under mpirun -np N: --batch is the global batch B (N must divide it), each rank\n"
                "trains on B/N, gradients are averaged across ranks; rank 0 alone prints and checkpoints");
  // The next five only matter with --ddp: given without it, they are refused (see the callback).
  cmd->add_option("--ddp-backend", a.ddp_backend, "With --ddp: auto | mpi | nccl (nccl: cuda, one GPU per rank)")
      ->capture_default_str();
  cmd->add_option("--bucket-mb", a.bucket_mb, "With --ddp: gradient bucket size in MiB (PyTorch's default 25)")
      ->capture_default_str()
      ->check(number_above_zero());
  cmd->add_option("--allreduce-dtype", a.allreduce_dtype,
                  "With --ddp: float32 | bfloat16 | float16: the dtype gradients cross the wire in; the 16-bit ones\n"
                  "halve the bytes of every all-reduce and round each averaged gradient (PyTorch's bf16_compress_hook)")
      ->capture_default_str();
  cmd->add_option("--ddp-timeout", a.ddp_timeout_s,
                  "With --ddp: seconds a rank waits for a collective before it stops with an error")
      ->capture_default_str()
      ->check(number_above_zero());
  cmd->add_option("--check-replicas-every", o.check_replicas_every,
                  "With --ddp: compare every rank's parameters every N steps (always at each epoch end and at the stop)")
      ->check(whole_number_at_least(0));
  cmd->callback([cmd] {
    auto& o = a.options;
    o.device = ferry::Device::parse(a.device);
    for (const char* flag : {"--checkpoint", "--resume", "--metrics", "--plot", "--trace", "--data"}) {
      FERRY_CHECK(cmd->count(flag) == 0 || !cmd->get_option(flag)->as<std::string>().empty(), InvalidArgument,
                  flag, " needs a file name, got an empty one");
    }
    FERRY_CHECK(o.checkpoint_every == 0 || !o.checkpoint_path.empty(), InvalidArgument,
                "--checkpoint-every needs --checkpoint FILE (where to write)");
    check_writable(o.checkpoint_path, "--checkpoint");
    if (!o.checkpoint_path.empty()) ferry::atomic_write_target(o.checkpoint_path);  // not a device, pipe or folder
    check_writable(o.metrics_path, "--metrics");
    check_writable(a.plot_path, "--plot");
    check_writable(a.trace_path, "--trace");
    if (o.optimizer == "adamw") {  // AdamW's usual values where the command line leaves them out (a --resume's
      if (cmd->count("--lr") == 0) o.lr = 1e-3;  // checkpoint then gives its own, below)
      if (cmd->count("--weight-decay") == 0) o.weight_decay = 1e-2;
    }
    std::vector<std::string> notes;  // printed before the run's first line
    std::int64_t resume_step = -1;  // the checkpoint's step; -1: no --resume
    if (!o.resume_path.empty()) {
      const ferry::CheckpointContents contents = ferry::read_checkpoint_contents(o.resume_path);
      notes = take_run_settings(*cmd, a, contents);
      resume_step = contents.progress.global_step;
    }
    FERRY_CHECK(o.optimizer != "adamw" || cmd->count("--momentum") == 0, InvalidArgument,
                "--momentum is SGD's; AdamW's moments use beta1 0.9 and beta2 0.999 (leave --momentum out)");
    o.placement = ferry::parse_placement(a.placement);
    o.allreduce_dtype = ferry::parse_dtype(a.allreduce_dtype);
    FERRY_CHECK(o.allreduce_dtype == ferry::DType::Float32 || o.allreduce_dtype == ferry::DType::BFloat16 ||
                    o.allreduce_dtype == ferry::DType::Float16,
                InvalidArgument, "--allreduce-dtype ", a.allreduce_dtype,
                ": gradients cross the wire as float32 (as computed), bfloat16 or float16");
    ferry::check_train_options(o);  // before the data is read: a bad --lr costs nothing
    FERRY_CHECK(!a.ddp || o.graphs != "on", InvalidArgument,
                "--graphs on: a data-parallel run (--ddp) steps eagerly, its all-reduces started from hooks during "
                "backward; use --graphs auto or off");
    // Options that only a data-parallel run reads: without --ddp they would be accepted and ignored.
    if (!a.ddp) {
      for (const char* flag :
           {"--ddp-backend", "--bucket-mb", "--allreduce-dtype", "--ddp-timeout", "--check-replicas-every"}) {
        FERRY_CHECK(cmd->count(flag) == 0, InvalidArgument, flag, " ", cmd->get_option(flag)->as<std::string>(),
                    " applies to a data-parallel run: it needs --ddp (under mpirun -np N)");
      }
      warn_if_ranks_without_ddp();
    }
    if (a.device == "auto" && o.device.is_cpu()) {
      notes.insert(notes.begin(), "note: --device auto chose cpu: " + ferry::unavailable_reason(ferry::DeviceType::CUDA));
    }
    // On the cpu the data is in host memory already and no placement moves it: a --placement given for an
    // accelerator would do nothing. Refused when the cpu was asked for, said when --device auto chose it.
    if (o.device.is_cpu() && cmd->count("--placement") > 0 && o.placement != ferry::Placement::Resident) {
      FERRY_CHECK(a.device == "auto", InvalidArgument, "--placement ", a.placement,
                  " decides how batches reach an accelerator; with --device ", a.device,
                  " the data stays in host memory and it would do nothing (leave --placement out, or name a device: ",
                  ferry::available_devices_text(), ")");
      notes.push_back(fmt::format("note: --placement {} does nothing on the cpu (the data stays in host memory)",
                                  a.placement));
    }
    // A checkpoint at or past --max-steps: the loop would stop before its first step. Said, and exit 0, so that a
    // script that resumes until the run is done (after a preemption, say) ends cleanly.
    if (resume_step >= 0 && o.max_steps >= 0 && resume_step >= o.max_steps) {
      const std::string line =
          fmt::format("note: checkpoint {} is already at step {} >= --max-steps {}: nothing to train (--max-steps "
                      "{} or more trains on)",
                      o.resume_path, resume_step, o.max_steps, resume_step + 1);
      if (a.json) {
        std::fprintf(stderr, "ferry: %s\n", line.c_str());  // stdout holds the JSON object alone, and there is none
      } else {
        for (const auto& note : notes) fmt::print("{}\n", note);
        fmt::print("{}\n", line);
      }
      return;
    }
    std::unique_ptr<ferry::dist::ProcessGroup> group;
    if (a.ddp) {
      const ferry::dist::LaunchInfo launch = ferry::dist::launch_info();
      // Ranks on one host share its cores (unless OMP_NUM_THREADS says otherwise) and its GPUs.
      if (!std::getenv("OMP_NUM_THREADS")) {
        omp_set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / launch.local_size));
      }
      if (o.device.is_cuda() && (a.device == "cuda" || a.device == "auto")) {
        o.device = ferry::Device(ferry::DeviceType::CUDA, launch.local_rank % ferry::device_count(ferry::DeviceType::CUDA));
      }
      FERRY_CHECK(a.bucket_mb > 0, InvalidArgument, "--bucket-mb must be > 0, got ", a.bucket_mb);
      group = ferry::dist::init_process_group({.backend = ferry::dist::parse_comm_backend(a.ddp_backend),
                                               .device = o.device, .timeout_s = a.ddp_timeout_s});
      o.process_group = group.get();
      o.bucket_bytes = std::llround(a.bucket_mb * 1024 * 1024);
    }
    const bool is_rank0 = !group || group->rank() == 0;
    ferry::manual_seed(o.seed);
    auto model = ferry::make_model(o.model_name);  // before the data (reading it draws no random numbers)
    // Only the images a --limit keeps are converted to floats (each file is still read and checked whole); -1,
    // the unset limit, is load_fashion_mnist's "all".
    ferry::Dataset train_set = ferry::load_fashion_mnist(a.data, true, a.limit_train);
    ferry::Dataset test_set = ferry::load_fashion_mnist(a.data, false, a.limit_test);
    if (!o.resume_path.empty() && o.checkpoint_path.empty()) {
      notes.push_back(fmt::format("note: no --checkpoint given: this run's progress is not saved (--checkpoint {} "
                                  "continues the file)", o.resume_path));
    }
    // A limit above what the split holds took all of it, said once (the run is not the one asked for).
    const auto note_limit = [&notes](const ferry::Dataset& set, std::int64_t count, const char* flag,
                                     const char* split) {
      if (count > set.size())
        notes.push_back(fmt::format("note: {} {} is more than the {} {} images: all of them are used", flag, count,
                                    set.size(), split));
    };
    note_limit(train_set, a.limit_train, "--limit-train", "training");
    note_limit(test_set, a.limit_test, "--limit-test", "test");
    if (group) {  // before any collective of the training: every rank must run the same one
      check_ranks_agree(*group, {
          {"--model", o.model_name}, {"--seed", std::to_string(o.seed)}, {"--batch", std::to_string(o.batch_size)},
          {"--accumulate", std::to_string(o.accumulate)},
          {"--clip-grad-norm", ferry::metadata_text(o.clip_grad_norm)}, {"--epochs", std::to_string(o.epochs)},
          {"--max-steps", std::to_string(o.max_steps)}, {"--optimizer", o.optimizer},
          {"--lr", ferry::metadata_text(o.lr)}, {"--momentum", ferry::metadata_text(o.momentum)},
          {"--weight-decay", ferry::metadata_text(o.weight_decay)}, {"--schedule", o.schedule},
          {"--warmup-steps", std::to_string(o.warmup_steps)}, {"--placement", a.placement},
          {"--log-every", std::to_string(o.log_every)},
          {"--check-replicas-every", std::to_string(o.check_replicas_every)},
          {"--bucket-mb", ferry::metadata_text(a.bucket_mb)}, {"--deterministic", o.deterministic ? "on" : "off"},
          {"--allreduce-dtype", std::string(ferry::dtype_name(o.allreduce_dtype))},
          {"the training images (--limit-train, --data)", std::to_string(train_set.size())},
          {"the test images (--limit-test, --data)", std::to_string(test_set.size())},
          {"the step resumed from (--resume)", resume_step < 0 ? std::string("none") : std::to_string(resume_step)},
      });
    }
    std::ostringstream sink;
    std::ostream& log = a.json || !is_rank0 ? static_cast<std::ostream&>(sink) : std::cout;
    // Each line as it is written, into a file or a pipe too (a non-terminal's stdout is block-buffered, so
    // `ferry train > log` showed nothing until the run ended).
    if (&log == &std::cout) std::cout << std::unitbuf;
    for (const auto& line : notes) log << line << "\n";
    o.stop_request = &stop_request;
    ferry::TrainResult r;
    {
      const StopOnSignal stop_on_signal;
      r = ferry::train(*model, train_set, test_set, o, log);
    }
    // Rank 0 alone reports, before MPI ends: under mpirun, Ctrl-C reaches the ranks as SIGTERM, and mpirun ends
    // what is left of them soon after.
    if (is_rank0) print_results(r, a, stdout);
    if (r.stopped_by != 0 && is_rank0) {  // said here, before the ranks part (see below); the exit status follows
      std::fprintf(stderr, "ferry: stopped by %s after %s; %s\n", signal_name(r.stopped_by).c_str(),
                   steps_text(r.steps).c_str(),
                   o.checkpoint_path.empty()
                       ? "no --checkpoint was given, so the progress is not saved"
                       : (o.checkpoint_path + " holds it: continue with ferry train --resume " + o.checkpoint_path +
                          " --checkpoint " + o.checkpoint_path).c_str());
      std::fflush(stderr);
    }
    if (group) {
      // Every rank leaves together, once rank 0 has saved and said all: a rank that ends first with a non-zero
      // status (a stop: 143) makes mpirun end the others (SIGTERM, then SIGKILL), and rank 0 lost its checkpoint
      // and report that way under a slow build (CI's sanitizers).
      group->barrier();
      group.reset();
      ferry::dist::finalize();
    }
    if (r.stopped_by != 0) throw ferry::Interrupted("", r.stopped_by);  // the shell's status: 128 + the signal
  });
}
