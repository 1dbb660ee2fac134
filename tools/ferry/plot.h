// plot.h — files `ferry train` writes besides checkpoints: an SVG of the run, the ledger's trace.
#pragma once

#include <string>

#include "ferry/trainer.h"

// Loss at each log step (left) and test accuracy per epoch (right), as a self-contained SVG.
void write_training_plot(const std::string& path, const ferry::TrainResult& result);
// The ledger's crossings, syncs and phases as Chrome trace-event JSON.
void write_trace_file(const std::string& path);
