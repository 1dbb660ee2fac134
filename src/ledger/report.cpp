// report.cpp — adds the ledger's records and the phase log up per step: T_transfer, T_compute, T_sync,
// bytes each way, syncs, S_real by the Golden Rule, and advice. Not here: recording, or trace export.
#include "ferry/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

#include "ferry/cost_model.h"
#include "ferry/error.h"
#include "ferry/units.h"

namespace ferry {

namespace {

// A blocking copy back to the host waits for the device: the door records it as a sync too
// (src/core/transfer.cpp), so its time belongs to T_sync, not T_transfer.
bool is_sync_transfer(const TransferRecord& t) { return t.direction == Direction::DeviceToHost && t.blocking; }
bool is_timing_sync(const SyncRecord& s) { return s.reason == kExactTimingReason; }
bool is_crossing(const TransferRecord& t) { return t.direction != Direction::HostToHost; }

// One step as it happened: its wall-time window and everything recorded in it.
struct StepInstance {
  std::int64_t step = -1;
  double start_ms = 0, end_ms = 0;  // host clock
  bool recorded = false;            // its wall time came from ferry::Step
  std::vector<const PhaseRecord*> phases;
  std::vector<const TransferRecord*> transfers;
  std::vector<const SyncRecord*> syncs;
};

// Finds the step a record belongs to: same step number, and (when ferry::Step recorded several steps
// with that number, as loops that restart at 0 each epoch do) the one whose window holds the record,
// else the nearest. A step number with no ferry::Step record is one step whose window grows to hold
// its records.
class StepIndex {
 public:
  explicit StepIndex(const std::vector<StepRecord>& steps) {
    for (const StepRecord& s : steps) add(s.step, s.start_ms, s.start_ms + s.duration_ms, true);
  }

  StepInstance& find(std::int64_t step, double start_ms, double end_ms) {
    const auto found = by_step_.find(step);
    if (found == by_step_.end()) return instances_[add(step, start_ms, end_ms, false)];
    StepInstance* best = nullptr;
    double best_distance = 0;
    for (const std::size_t i : found->second) {
      StepInstance& candidate = instances_[i];
      if (!candidate.recorded) {
        candidate.start_ms = std::min(candidate.start_ms, start_ms);
        candidate.end_ms = std::max(candidate.end_ms, end_ms);
        return candidate;
      }
      const double distance = start_ms < candidate.start_ms ? candidate.start_ms - start_ms
                              : start_ms > candidate.end_ms ? start_ms - candidate.end_ms
                                                            : 0.0;
      if (!best || distance < best_distance) {
        best = &candidate;
        best_distance = distance;
      }
    }
    return *best;
  }

  std::vector<StepInstance>& instances() { return instances_; }

 private:
  std::size_t add(std::int64_t step, double start_ms, double end_ms, bool recorded) {
    StepInstance instance;
    instance.step = step;
    instance.start_ms = start_ms;
    instance.end_ms = end_ms;
    instance.recorded = recorded;
    instances_.push_back(std::move(instance));
    by_step_[step].push_back(instances_.size() - 1);
    return instances_.size() - 1;
  }

  std::vector<StepInstance> instances_;
  std::unordered_map<std::int64_t, std::vector<std::size_t>> by_step_;  // step number -> instances
};

// Length of the union of intervals [start, end): the time during which at least one part ran.
double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0, open_start = 0, open_end = 0;
  bool open = false;
  for (const auto& [start, end] : intervals) {
    if (open && start <= open_end) {
      open_end = std::max(open_end, end);
      continue;
    }
    if (open) total += open_end - open_start;
    open = true;
    open_start = start;
    open_end = end;
  }
  if (open) total += open_end - open_start;
  return total;
}

struct Sources {
  bool transfer_phases = false, compute_phases = false, sync_phases = false;
};

StepAccount account_step(const StepInstance& instance, const Sources& sources,
                         std::map<std::string, std::int64_t>& sync_reasons) {
  StepAccount a;
  a.step = instance.step;
  std::vector<std::pair<double, double>> busy;  // every part's interval, ms
  for (const PhaseRecord* p : instance.phases) {
    const bool counted = (p->kind == PhaseKind::Transfer && sources.transfer_phases) ||
                         (p->kind == PhaseKind::Compute && sources.compute_phases) ||
                         (p->kind == PhaseKind::Sync && sources.sync_phases);
    if (!counted) continue;
    if (p->kind == PhaseKind::Transfer) a.t_transfer_ms += p->duration_ms;
    if (p->kind == PhaseKind::Compute) a.t_compute_ms += p->duration_ms;
    if (p->kind == PhaseKind::Sync) a.t_sync_ms += p->duration_ms;
    busy.emplace_back(p->start_ms, p->start_ms + p->duration_ms);
  }
  for (const TransferRecord* t : instance.transfers) {
    if (!is_crossing(*t)) continue;
    a.transfers += 1;
    switch (t->direction) {
      case Direction::HostToDevice:
        a.bytes_host_to_device += t->bytes;
        if (!t->pinned) a.bytes_host_to_device_pageable += t->bytes;
        break;
      case Direction::DeviceToHost: a.bytes_device_to_host += t->bytes; break;
      case Direction::DeviceToDevice: a.bytes_device_to_device += t->bytes; break;
      case Direction::HostToHost: break;
    }
    if (!t->blocking && !t->pinned && t->direction != Direction::DeviceToDevice) a.pageable_non_blocking += 1;
    if (!sources.transfer_phases && !is_sync_transfer(*t)) {
      a.t_transfer_ms += t->duration_ms;
      busy.emplace_back(t->start_ms, t->start_ms + t->duration_ms);
    }
  }
  for (const SyncRecord* s : instance.syncs) {
    if (is_timing_sync(*s)) {
      a.timing_syncs += 1;
      continue;
    }
    a.syncs += 1;
    a.sync_wait_ms += s->duration_ms;
    sync_reasons[s->reason] += 1;
    if (!sources.sync_phases) {
      a.t_sync_ms += s->duration_ms;
      busy.emplace_back(s->start_ms, s->start_ms + s->duration_ms);
    }
  }
  const double parts_ms = a.t_transfer_ms + a.t_compute_ms + a.t_sync_ms;
  const double busy_ms = union_length(busy);
  a.t_overlap_ms = std::max(0.0, parts_ms - busy_ms);
  a.t_step_ms = std::max(0.0, instance.end_ms - instance.start_ms);
  a.t_other_ms = std::max(0.0, a.t_step_ms - busy_ms);
  return a;
}

void add_into(StepAccount& sum, const StepAccount& a) {
  sum.t_step_ms += a.t_step_ms;
  sum.t_transfer_ms += a.t_transfer_ms;
  sum.t_compute_ms += a.t_compute_ms;
  sum.t_sync_ms += a.t_sync_ms;
  sum.t_overlap_ms += a.t_overlap_ms;
  sum.t_other_ms += a.t_other_ms;
  sum.bytes_host_to_device += a.bytes_host_to_device;
  sum.bytes_device_to_host += a.bytes_device_to_host;
  sum.bytes_device_to_device += a.bytes_device_to_device;
  sum.bytes_host_to_device_pageable += a.bytes_host_to_device_pageable;
  sum.transfers += a.transfers;
  sum.pageable_non_blocking += a.pageable_non_blocking;
  sum.syncs += a.syncs;
  sum.timing_syncs += a.timing_syncs;
  sum.sync_wait_ms += a.sync_wait_ms;
}

// Per-step mean. Counts and bytes are rounded to whole numbers here; report_json prints their exact
// means (totals / steps).
StepAccount mean_of(const StepAccount& total, std::int64_t steps) {
  StepAccount m;
  if (steps <= 0) return m;
  const double n = static_cast<double>(steps);
  auto per = [steps](std::int64_t value) { return (value + steps / 2) / steps; };
  m.t_step_ms = total.t_step_ms / n;
  m.t_transfer_ms = total.t_transfer_ms / n;
  m.t_compute_ms = total.t_compute_ms / n;
  m.t_sync_ms = total.t_sync_ms / n;
  m.t_overlap_ms = total.t_overlap_ms / n;
  m.t_other_ms = total.t_other_ms / n;
  m.bytes_host_to_device = per(total.bytes_host_to_device);
  m.bytes_device_to_host = per(total.bytes_device_to_host);
  m.bytes_device_to_device = per(total.bytes_device_to_device);
  m.bytes_host_to_device_pageable = per(total.bytes_host_to_device_pageable);
  m.transfers = per(total.transfers);
  m.pageable_non_blocking = per(total.pageable_non_blocking);
  m.syncs = per(total.syncs);
  m.timing_syncs = per(total.timing_syncs);
  m.sync_wait_ms = total.sync_wait_ms / n;
  return m;
}

// 0.41 -> "41 %", 0.038 -> "3.8 %", 0.0012 -> "0.12 %".
std::string percent(double fraction) {
  const double value = 100.0 * fraction;
  if (value >= 10) return fmt::format("{:.0f} %", value);
  if (value >= 1) return fmt::format("{:.1f} %", value);
  return fmt::format("{:.2g} %", value);
}

// The accelerator most bytes went to, for advice ("keep the dataset resident on sim:0").
std::string busiest_accelerator(const std::vector<StepInstance>& counted) {
  std::map<std::string, std::int64_t> bytes_to;
  for (const StepInstance& instance : counted) {
    for (const TransferRecord* t : instance.transfers) {
      if (t->direction == Direction::HostToDevice) bytes_to[t->target.str()] += t->bytes;
    }
  }
  std::string best = "the device";
  std::int64_t most = -1;
  for (const auto& [name, bytes] : bytes_to) {
    if (bytes > most) {
      best = name;
      most = bytes;
    }
  }
  return best;
}

struct Advice {
  double weight;  // fraction of the step it is about; orders the lines
  std::string text;
};

std::vector<std::string> advise(const LedgerReport& r, const ReportOptions& options, const std::string& device) {
  std::vector<Advice> lines;
  if (r.steps == 0) {
    return {"no training steps were recorded: wrap each step in ferry::Step step(n) (or Ledger::begin_step and "
            "end_step) so that the report can add its parts up"};
  }
  const StepAccount& m = r.mean;
  const double steps = static_cast<double>(r.steps);
  const double syncs_per_step = static_cast<double>(r.total.syncs) / steps;
  const bool host_timed_async = r.async_device && !r.exact_timing;
  bool costly = false;

  if (r.transfer_fraction >= options.advice_threshold) {
    costly = true;
    std::string text;
    if (m.bytes_host_to_device > 0 && m.bytes_host_to_device_pageable == 0) {
      text = fmt::format("copies every step take {} of the step, already from pinned memory: keep the dataset "
                         "resident on {}, or copy the next batch on the copy stream while this one computes",
                         percent(r.transfer_fraction), device);
    } else {
      text = fmt::format("copies every step take {} of the step: keep the dataset resident on {} or prefetch from "
                         "pinned memory",
                         percent(r.transfer_fraction), device);
      if (m.bytes_host_to_device_pageable > 0) {
        text += fmt::format(" ({} per step cross from pageable memory)",
                            format_bytes(static_cast<double>(m.bytes_host_to_device_pageable)));
      }
    }
    lines.push_back({r.transfer_fraction, text});
  }

  if (r.total.syncs > 0 && r.sync_fraction >= options.sync_advice_threshold) {
    costly = true;
    std::string reason;
    std::int64_t most = -1;
    for (const auto& [name, count] : r.sync_reasons) {
      if (count > most) {
        reason = name;
        most = count;
      }
    }
    const double saved = r.sync_fraction * (1.0 - 1.0 / static_cast<double>(options.log_every));
    const std::string every = syncs_per_step >= 0.999 ? " every step" : "";
    std::string text;
    if (reason == "item()" && r.sync_reasons.size() == 1) {
      text = fmt::format("item(){} costs {} of the step: log every {} step instead (saves about {}), and keep "
                         "running sums on the device",
                         every, percent(r.sync_fraction), format_ordinal(options.log_every), percent(saved));
    } else {
      std::string reasons;
      for (const auto& [name, count] : r.sync_reasons) {
        reasons += fmt::format("{}{} x{}", reasons.empty() ? "" : ", ", name, count);
      }
      text = fmt::format("{} host syncs per step ({}) cost {} of the step: read values back every {} step only "
                         "(saves about {})",
                         fmt::format("{:.3g}", syncs_per_step), reasons, percent(r.sync_fraction),
                         format_ordinal(options.log_every), percent(saved));
    }
    if (host_timed_async) {
      text += "; timed on the host, so part of it is the device finishing queued work (PhaseTiming::Exact splits it)";
    }
    lines.push_back({r.sync_fraction, text});
  }

  if (m.bytes_device_to_host >= 1'000'000) {
    lines.push_back({0.0, fmt::format("{} come back to the host every step: keep metrics and predictions on the "
                                      "device and read them back every {} step",
                                      format_bytes(static_cast<double>(m.bytes_device_to_host)),
                                      format_ordinal(options.log_every))});
  }
  if (r.total.pageable_non_blocking > 0) {
    lines.push_back({0.0, fmt::format("{} non_blocking copies came from pageable memory, so they blocked: pin the "
                                      "host tensors (pin_memory()) to let them overlap compute",
                                      r.total.pageable_non_blocking)});
  }
  if (r.compute_source == "phases" && r.other_fraction >= 2 * options.advice_threshold) {
    costly = true;
    lines.push_back({r.other_fraction, fmt::format("{} of the step is outside every phase (data loading, the "
                                                   "optimizer?): wrap it in a ferry::Phase to see where it goes",
                                                   percent(r.other_fraction))});
  }
  if (r.compute_source != "phases") {
    lines.push_back({0.0, "no compute phase was recorded: wrap forward and backward in "
                          "ferry::Phase(PhaseKind::Compute, device) to get T_compute and S_real"});
  }
  if (host_timed_async && r.compute_source == "phases") {
    lines.push_back({0.0, "compute was timed on the host while the device runs asynchronously: kernel time shows up "
                          "in the next sync; PhaseTiming::Exact times each part exactly (adding two syncs per phase)"});
  }
  if (r.total.timing_syncs > 0) {
    lines.push_back({0.0, fmt::format("exact timing added {:.3g} syncs per step: use PhaseTiming::Host outside "
                                      "measurements",
                                      static_cast<double>(r.total.timing_syncs) / steps)});
  }
  if (!costly) {
    lines.push_back({0.0, fmt::format("copies and syncs take {} of the step: nothing to fix, the data stays where it "
                                      "is computed",
                                      percent(r.transfer_fraction + r.sync_fraction))});
  }
  std::stable_sort(lines.begin(), lines.end(), [](const Advice& a, const Advice& b) { return a.weight > b.weight; });
  std::vector<std::string> out;
  for (Advice& line : lines) out.push_back(std::move(line.text));
  return out;
}

}  // namespace

LedgerReport make_report(const ReportOptions& options) { return make_report(ledger_snapshot(), options); }

LedgerReport make_report(const LedgerSnapshot& snapshot, const ReportOptions& options) {
  FERRY_CHECK(options.warmup_steps >= 0, InvalidArgument, "warmup_steps must be >= 0, got ", options.warmup_steps);
  FERRY_CHECK(options.log_every >= 1, InvalidArgument, "log_every must be >= 1, got ", options.log_every);
  if (options.speedup) {
    FERRY_CHECK(std::isfinite(*options.speedup) && *options.speedup > 0, InvalidArgument,
                "the speedup S must be a positive number, got ", *options.speedup);
  }
  LedgerReport r;
  Sources sources;
  for (const PhaseRecord& p : snapshot.phases) {
    if (p.kind == PhaseKind::Transfer) sources.transfer_phases = true;
    if (p.kind == PhaseKind::Compute) sources.compute_phases = true;
    if (p.kind == PhaseKind::Sync) sources.sync_phases = true;
    if (p.exact) r.exact_timing = true;
    if (p.device.is_cuda()) r.async_device = true;
  }

  StepIndex index(snapshot.steps);
  for (const PhaseRecord& p : snapshot.phases) {
    if (p.step >= 0) index.find(p.step, p.start_ms, p.start_ms + p.duration_ms).phases.push_back(&p);
  }
  for (const TransferRecord& t : snapshot.transfers) {
    if (t.source.is_cuda() || t.target.is_cuda()) r.async_device = true;
    if (t.step >= 0) {
      index.find(t.step, t.start_ms, t.start_ms + t.duration_ms).transfers.push_back(&t);
    } else if (is_crossing(t)) {
      r.outside_transfers += 1;
      if (t.direction == Direction::HostToDevice) r.outside_bytes_host_to_device += t.bytes;
      if (t.direction == Direction::DeviceToHost) r.outside_bytes_device_to_host += t.bytes;
    }
  }
  for (const SyncRecord& s : snapshot.syncs) {
    if (s.step >= 0) {
      index.find(s.step, s.start_ms, s.start_ms + s.duration_ms).syncs.push_back(&s);
    } else if (!is_timing_sync(s)) {
      r.outside_syncs += 1;
    }
  }

  std::vector<StepInstance>& instances = index.instances();
  std::stable_sort(instances.begin(), instances.end(),
                   [](const StepInstance& a, const StepInstance& b) { return a.start_ms < b.start_ms; });
  const std::size_t skip = std::min<std::size_t>(static_cast<std::size_t>(options.warmup_steps), instances.size());
  r.warmup_steps_skipped = static_cast<std::int64_t>(skip);
  const std::vector<StepInstance> counted(instances.begin() + static_cast<std::ptrdiff_t>(skip), instances.end());
  for (const StepInstance& instance : counted) {
    r.per_step.push_back(account_step(instance, sources, r.sync_reasons));
    add_into(r.total, r.per_step.back());
  }
  r.steps = static_cast<std::int64_t>(r.per_step.size());
  r.mean = mean_of(r.total, r.steps);

  r.transfer_source = sources.transfer_phases ? "phases" : (r.total.transfers > 0 ? "ledger" : "none");
  r.compute_source = sources.compute_phases ? "phases" : "none";
  r.sync_source = sources.sync_phases ? "phases" : (r.total.syncs > 0 ? "ledger" : "none");

  if (r.mean.t_step_ms > 0) {
    r.transfer_fraction = r.mean.t_transfer_ms / r.mean.t_step_ms;
    r.compute_fraction = r.mean.t_compute_ms / r.mean.t_step_ms;
    r.sync_fraction = r.mean.t_sync_ms / r.mean.t_step_ms;
    r.other_fraction = r.mean.t_other_ms / r.mean.t_step_ms;
  }

  if (options.speedup) {
    r.speedup = *options.speedup;
    if (r.mean.t_compute_ms > 0) {
      const double compute_s = r.mean.t_compute_ms / 1e3;
      const cost::GoldenRule rule = cost::golden_rule(*options.speedup, compute_s, r.mean.t_transfer_ms / 1e3);
      r.speedup_real = rule.speedup_real;
      r.efficiency = rule.efficiency;
      r.speedup_real_with_syncs =
          cost::golden_rule(*options.speedup, compute_s, (r.mean.t_transfer_ms + r.mean.t_sync_ms) / 1e3).speedup_real;
      const double exposed_ms = std::max(0.0, r.mean.t_transfer_ms - r.mean.t_overlap_ms);
      r.speedup_real_exposed = cost::golden_rule(*options.speedup, compute_s, exposed_ms / 1e3).speedup_real;
    }
  }
  r.advice = advise(r, options, busiest_accelerator(counted));
  return r;
}

// ---- printing ------------------------------------------------------------------------------------

std::string report_text(const LedgerReport& r) {
  std::string out = fmt::format("ferry ledger report: {} step{}", r.steps, r.steps == 1 ? "" : "s");
  if (r.warmup_steps_skipped > 0) out += fmt::format(" ({} warm-up skipped)", r.warmup_steps_skipped);
  out += fmt::format("; times from {} (transfer), {} (compute), {} (sync), {} clock\n", r.transfer_source,
                     r.compute_source, r.sync_source, r.exact_timing ? "exact (device-synchronised)" : "host");
  if (r.steps > 0) {
    const StepAccount& m = r.mean;
    out += "per step (mean)          time       of the step\n";
    auto row = [&out, &m](const char* name, double ms) {
      const double fraction = m.t_step_ms > 0 ? ms / m.t_step_ms : 0.0;
      out += fmt::format("  {:<20} {:>10}   {:>7}\n", name, format_seconds(ms / 1e3), percent(fraction));
    };
    row("T_transfer", m.t_transfer_ms);
    row("T_compute", m.t_compute_ms);
    row("T_sync", m.t_sync_ms);
    row("other", m.t_other_ms);
    if (m.t_overlap_ms > 0) row("overlap (counted 2x)", m.t_overlap_ms);
    out += fmt::format("  {:<20} {:>10}\n", "step", format_seconds(m.t_step_ms / 1e3));
    const double steps = static_cast<double>(r.steps);
    out += fmt::format("bytes per step: host->device {}, device->host {}, device->device {}\n",
                       format_bytes(static_cast<double>(r.total.bytes_host_to_device) / steps),
                       format_bytes(static_cast<double>(r.total.bytes_device_to_host) / steps),
                       format_bytes(static_cast<double>(r.total.bytes_device_to_device) / steps));
    out += fmt::format("crossings per step: {:.3g}; host syncs per step: {:.3g}",
                       static_cast<double>(r.total.transfers) / steps, static_cast<double>(r.total.syncs) / steps);
    if (!r.sync_reasons.empty()) {
      std::string reasons;
      for (const auto& [name, count] : r.sync_reasons) {
        reasons += fmt::format("{}{} x{}", reasons.empty() ? "" : ", ", name, count);
      }
      out += " (" + reasons + ")";
    }
    if (r.total.timing_syncs > 0) {
      out += fmt::format("; plus {:.3g} for exact timing", static_cast<double>(r.total.timing_syncs) / steps);
    }
    out += "\n";
  }
  if (r.outside_transfers > 0 || r.outside_syncs > 0) {
    out += fmt::format("outside steps: {} crossings ({} host->device, {} device->host), {} syncs\n",
                       r.outside_transfers, format_bytes(static_cast<double>(r.outside_bytes_host_to_device)),
                       format_bytes(static_cast<double>(r.outside_bytes_device_to_host)), r.outside_syncs);
  }
  if (r.speedup_real) {
    out += fmt::format("Golden Rule: S_real = S / (1 + T_transfer / T_compute) = {} / (1 + {}) = {}x "
                       "(efficiency {})\n",
                       format_number(*r.speedup, 4), format_number(r.mean.t_transfer_ms / r.mean.t_compute_ms, 4),
                       format_number(*r.speedup_real, 4), percent(*r.efficiency));
    out += fmt::format("  counting syncs as transfers: {}x", format_number(*r.speedup_real_with_syncs, 4));
    if (r.mean.t_overlap_ms > 0) {
      out += fmt::format("; counting only copy time not overlapped: {}x", format_number(*r.speedup_real_exposed, 4));
    }
    out += "\n";
  } else if (r.speedup) {
    out += "Golden Rule: no T_compute recorded, so no S_real\n";
  }
  if (!r.advice.empty()) {
    out += "advice:\n";
    for (const std::string& line : r.advice) out += "  - " + line + "\n";
  }
  return out;
}

namespace {
nlohmann::ordered_json account_json(const StepAccount& a, bool with_step) {
  nlohmann::ordered_json j;
  if (with_step) j["step"] = a.step;
  j["t_step_ms"] = a.t_step_ms;
  j["t_transfer_ms"] = a.t_transfer_ms;
  j["t_compute_ms"] = a.t_compute_ms;
  j["t_sync_ms"] = a.t_sync_ms;
  j["t_overlap_ms"] = a.t_overlap_ms;
  j["t_other_ms"] = a.t_other_ms;
  j["bytes_host_to_device"] = a.bytes_host_to_device;
  j["bytes_device_to_host"] = a.bytes_device_to_host;
  j["bytes_device_to_device"] = a.bytes_device_to_device;
  j["bytes_host_to_device_pageable"] = a.bytes_host_to_device_pageable;
  j["transfers"] = a.transfers;
  j["pageable_non_blocking"] = a.pageable_non_blocking;
  j["syncs"] = a.syncs;
  j["timing_syncs"] = a.timing_syncs;
  j["sync_wait_ms"] = a.sync_wait_ms;
  return j;
}

nlohmann::ordered_json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
}
}  // namespace

std::string report_json(const LedgerReport& r) {
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["warmup_steps_skipped"] = r.warmup_steps_skipped;
  nlohmann::ordered_json per_step = account_json(r.mean, false);
  if (r.steps > 0) {  // exact means of the counts (mean holds them rounded)
    const double steps = static_cast<double>(r.steps);
    per_step["bytes_host_to_device"] = static_cast<double>(r.total.bytes_host_to_device) / steps;
    per_step["bytes_device_to_host"] = static_cast<double>(r.total.bytes_device_to_host) / steps;
    per_step["bytes_device_to_device"] = static_cast<double>(r.total.bytes_device_to_device) / steps;
    per_step["bytes_host_to_device_pageable"] = static_cast<double>(r.total.bytes_host_to_device_pageable) / steps;
    per_step["transfers"] = static_cast<double>(r.total.transfers) / steps;
    per_step["pageable_non_blocking"] = static_cast<double>(r.total.pageable_non_blocking) / steps;
    per_step["syncs"] = static_cast<double>(r.total.syncs) / steps;
    per_step["timing_syncs"] = static_cast<double>(r.total.timing_syncs) / steps;
  }
  j["per_step"] = per_step;
  j["total"] = account_json(r.total, false);
  j["fractions"] = {{"transfer", r.transfer_fraction},
                    {"compute", r.compute_fraction},
                    {"sync", r.sync_fraction},
                    {"other", r.other_fraction}};
  j["speedup"] = optional_json(r.speedup);
  j["speedup_real"] = optional_json(r.speedup_real);
  j["efficiency"] = optional_json(r.efficiency);
  j["speedup_real_with_syncs"] = optional_json(r.speedup_real_with_syncs);
  j["speedup_real_exposed"] = optional_json(r.speedup_real_exposed);
  j["sync_reasons"] = r.sync_reasons;
  j["sources"] = {{"transfer", r.transfer_source}, {"compute", r.compute_source}, {"sync", r.sync_source}};
  j["exact_timing"] = r.exact_timing;
  j["outside_steps"] = {{"transfers", r.outside_transfers},
                        {"syncs", r.outside_syncs},
                        {"bytes_host_to_device", r.outside_bytes_host_to_device},
                        {"bytes_device_to_host", r.outside_bytes_device_to_host}};
  j["advice"] = r.advice;
  nlohmann::ordered_json details = nlohmann::ordered_json::array();
  for (const StepAccount& a : r.per_step) details.push_back(account_json(a, true));
  j["step_details"] = details;
  return j.dump();
}

std::string allreduce_advice(double wait_fraction, std::int64_t bytes_per_step, DType allreduce_dtype,
                             double threshold) {
  if (!(wait_fraction >= threshold)) return "";
  std::string text = fmt::format("the host waited {} of each step for the gradient all-reduce ({} per step in {}), "
                                 "time backward did not hide: ",
                                 percent(wait_fraction), format_bytes(static_cast<double>(bytes_per_step)),
                                 dtype_name(allreduce_dtype));
  if (!is_storage_only(allreduce_dtype)) {
    text += "gradients sent in bfloat16 (--allreduce-dtype, DDPOptions::allreduce_dtype) take half the bytes; ";
  }
  return text + "a larger batch per rank gives each all-reduce more compute to hide behind, and ranks on one host "
                "share its cores and memory (docs/distributed.md)";
}

}  // namespace ferry
