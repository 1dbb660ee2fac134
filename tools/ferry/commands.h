// commands.h — each `ferry <command>` registers itself on the root CLI11 app.
// A command's callback throws ferry errors; main() alone turns them into exit codes.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

void register_plan_command(CLI::App& app);
void register_devices_command(CLI::App& app);
void register_train_command(CLI::App& app);
void register_eval_command(CLI::App& app);
void register_inspect_command(CLI::App& app);
void register_convert_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_bench_allreduce(CLI::App& bench);  // `ferry bench allreduce` (bench_allreduce.cpp)
void register_bench_golden(CLI::App& bench);     // `ferry bench golden` (bench_golden.cpp)

// An output file named by `option` (--checkpoint, --save, ...), checked before the work that fills it rather than
// after: not a folder, in a folder that exists, writable. InvalidArgument (exit 2) otherwise; "" passes.
void check_writable(const std::string& path, const char* option);  // output_path.cpp

// A check for whole-number options: "--epochs: expected a whole number >= 1, got 0" (CLI::PositiveNumber's own
// message prints its range up to the largest double).
inline CLI::Validator whole_number_at_least(long long least) {
  const std::string bound = std::to_string(least);
  return CLI::Validator(
      [least, bound](std::string& input) -> std::string {
        try {
          std::size_t used = 0;
          const long long value = std::stoll(input, &used);
          if (used == input.size() && value >= least) return "";
        } catch (const std::exception&) {
        }
        return "expected a whole number >= " + bound + ", got " + input;
      },
      "");
}

// A check for options that take a positive real number (seconds, MiB): "--max-seconds: expected a number > 0, got
// -1". Refused rather than read as "no limit" or as the default.
inline CLI::Validator number_above_zero() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        try {
          std::size_t used = 0;
          const double value = std::stod(input, &used);
          if (used == input.size() && value > 0 && value <= 1.7976931348623157e308) return "";
        } catch (const std::exception&) {
        }
        return "expected a number > 0, got " + input;
      },
      "");
}
