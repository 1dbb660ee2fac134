// ferry/report.h — the ledger report: what each training step spent on transfers, compute and syncs,
// the bytes each way, the syncs per step, S_real by the Golden Rule, and advice in plain words.
// Not here: recording (ferry/ledger.h, ferry/phase.h), the formulas themselves (ferry/cost_model.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/dtype.h"
#include "ferry/phase.h"

namespace ferry {

struct ReportOptions {
  // S, the speedup of the device over the host (measured, or the sheet's theoretical S from
  // `ferry devices`). Without it the report gives no S_real.
  std::optional<double> speedup = std::nullopt;
  std::int64_t warmup_steps = 0;   // the first steps (in time order) left out: first-touch allocations, caches
  double advice_threshold = 0.10;  // a fraction of the step above which transfers or other time get advice
  double sync_advice_threshold = 0.01;  // the same for host syncs (Exercise 5.1: small costs add up)
  std::int64_t log_every = 100;    // what the sync advice proposes instead of every step
};

// One step (or, in LedgerReport::mean and ::total, the per-step mean and the sum over steps).
// Times are host-clock milliseconds. t_transfer_ms, t_compute_ms and t_sync_ms come from phases of that
// kind when the run recorded any (ferry::Phase); otherwise from the ledger's records (transfers that
// are not syncs; syncs), and compute is then unknown (0).
struct StepAccount {
  std::int64_t step = -1;         // the ledger's step number; -1 in mean and total
  double t_step_ms = 0;           // wall time: ferry::Step's record, else first start to last end
  double t_transfer_ms = 0;
  double t_compute_ms = 0;
  double t_sync_ms = 0;
  double t_overlap_ms = 0;        // time counted in two parts at once (phases on different threads)
  double t_other_ms = 0;          // wall time outside every part: t_step - (parts - overlap), >= 0
  std::int64_t bytes_host_to_device = 0;  // bytes
  std::int64_t bytes_device_to_host = 0;
  std::int64_t bytes_device_to_device = 0;
  std::int64_t bytes_host_to_device_pageable = 0;  // of bytes_host_to_device, from pageable memory
  std::int64_t transfers = 0;     // crossings (host->host copies are not crossings and not counted)
  std::int64_t pageable_non_blocking = 0;  // non_blocking copies from pageable memory: really blocking
  std::int64_t syncs = 0;         // host syncs the loop asked for (item(), cpu(), synchronize(), ...)
  std::int64_t timing_syncs = 0;  // syncs added by PhaseTiming::Exact, counted apart
  double sync_wait_ms = 0;        // host time waiting in those syncs (the ledger's records)
};

struct LedgerReport {
  std::int64_t steps = 0;                 // steps counted (after warm-up)
  std::int64_t warmup_steps_skipped = 0;
  std::vector<StepAccount> per_step;      // every counted step, in time order
  StepAccount mean;                       // per-step mean over the counted steps; its counts and bytes are
                                          // rounded to whole numbers (total / steps is the exact mean, as
                                          // report_json prints it)
  StepAccount total;                      // sums over the counted steps
  std::map<std::string, std::int64_t> sync_reasons;  // reason -> count over the counted steps
  // Records outside any step (step -1): set-up copies, evaluation.
  std::int64_t outside_transfers = 0, outside_syncs = 0;
  std::int64_t outside_bytes_host_to_device = 0, outside_bytes_device_to_host = 0;
  // Where the times came from: "phases", "ledger" or "none".
  std::string transfer_source, compute_source, sync_source;
  bool exact_timing = false;              // some phase used PhaseTiming::Exact
  bool async_device = false;              // a phase or crossing involved an asynchronous device (cuda)
  // Fractions of the mean step (0 when the step time is 0).
  double transfer_fraction = 0, compute_fraction = 0, sync_fraction = 0, other_fraction = 0;
  // The Golden Rule, from the mean step: present when options.speedup is set and T_compute > 0.
  std::optional<double> speedup;                  // S as given
  std::optional<double> speedup_real;            // S / (1 + T_transfer / T_compute)
  std::optional<double> efficiency;              // S_real / S
  std::optional<double> speedup_real_with_syncs; // S / (1 + (T_transfer + T_sync) / T_compute)
  std::optional<double> speedup_real_exposed;    // S / (1 + max(0, T_transfer - T_overlap) / T_compute)
  std::vector<std::string> advice;                // plain-words lines, most costly first
};

// The report of everything recorded so far (Ledger::global() and PhaseLog::global()).
LedgerReport make_report(const ReportOptions& options = {});
// The report of a snapshot: for tests, and for reports of a saved run.
LedgerReport make_report(const LedgerSnapshot& snapshot, const ReportOptions& options = {});

// A printable account, a few lines per part, then the Golden Rule and the advice.
std::string report_text(const LedgerReport& report);
// One JSON object on one line: "steps", "per_step" {t_*_ms, bytes_*, syncs, ...}, "total", "fractions",
// "speedup", "speedup_real", "efficiency" (null when unknown), "sync_reasons", "sources", "advice",
// "step_details" (one object per counted step).
std::string report_json(const LedgerReport& report);

// Advice on a data-parallel run's gradient all-reduce, in plain words, or "" when it costs less than `threshold` of
// the step. wait_fraction: the host's wait for gradients after backward (the communication backward did not hide)
// over the step time; bytes_per_step: what each rank all-reduced per step, in allreduce_dtype.
std::string allreduce_advice(double wait_fraction, std::int64_t bytes_per_step, DType allreduce_dtype,
                             double threshold = 0.10);

}  // namespace ferry
