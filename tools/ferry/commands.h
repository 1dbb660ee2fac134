// commands.h — each `ferry <command>` registers itself on the root CLI11 app.
// A command's callback throws ferry errors; main() alone turns them into exit codes.
#pragma once

#include <CLI/CLI.hpp>

void register_plan_command(CLI::App& app);
void register_devices_command(CLI::App& app);
void register_train_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_inspect_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_bench_allreduce(CLI::App& bench);  // `ferry bench allreduce` (bench_allreduce.cpp)
void register_bench_golden(CLI::App& bench);     // `ferry bench golden` (bench_golden.cpp)
