// main.cpp — the ferry command line. The one place where errors become exit codes:
// 0 success, 1 a runtime failure (file, device, numerics), 2 bad usage or bad input, 128 + N a run stopped
// cleanly by signal N (130 for Ctrl-C, 143 for SIGTERM), its progress saved.
#include <cblas.h>

#include <cctype>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "ferry/backend.h"
#include "ferry/determinism.h"
#include "ferry/error.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/module.h"
#include "ferry/readback.h"

namespace {
// `ferry --version`: the version and what this build holds (which backends and libraries were compiled in).
std::string version_text() {
  std::string text = "ferry " FERRY_VERSION "\nbuilt with: cpu (";
  text += openblas_get_config();
  const std::string onednn = ferry::nn::functional::onednn_version();
  text += onednn.empty() ? "; no oneDNN: convolutions on OpenBLAS)" : "; " + onednn + ")";
#ifdef FERRY_HAVE_CUDA
  text += ", cuda";
#ifdef FERRY_HAVE_CUDNN
  text += " + cuDNN";
#endif
#ifdef FERRY_HAVE_NCCL
  text += " + NCCL";
#endif
#else
  text += ", no cuda (nvcc was not found, or FERRY_CUDA=OFF)";
#endif
#ifdef FERRY_HAVE_MPI
  text += ", MPI";
#else
  text += ", no MPI";
#endif
#if defined(__clang__)
  text += ", sim; compiler " __VERSION__;
#else
  text += ", sim; compiler g++ " __VERSION__;
#endif
  return text;
}
// An error as one line on stderr: "ferry: error: TEXT". Text that spans lines (a library's message in PyTorch's
// several-line form) is joined with "; ", so that scripts reading ferry's last line get all of it.
void say(const char* prefix, const char* what) {
  std::fflush(stdout);  // what stdout holds came first: into one log file, the error follows its context
  std::string text;
  for (const char* c = what; *c != '\0'; ++c) {
    if (*c != '\n') {
      text += *c;
      continue;
    }
    while (c[1] == '\t' || c[1] == ' ' || c[1] == '\n') ++c;
    if (c[1] != '\0') text += "; ";
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  // A NaN with its sign bit set streams as "-nan" (glibc); the sign of a NaN means nothing, so it reads "nan", as
  // Python and PyTorch print it. Only the word on its own: "--nan-check" stays.
  for (std::size_t at = text.find("-nan"); at != std::string::npos; at = text.find("-nan", at + 1)) {
    const bool starts = at == 0 || (!std::isalnum(static_cast<unsigned char>(text[at - 1])) && text[at - 1] != '-');
    const bool ends = at + 4 == text.size() || !std::isalnum(static_cast<unsigned char>(text[at + 4]));
    if (starts && ends) text.erase(at, 1);
  }
  std::fprintf(stderr, "ferry: %s%s\n", prefix, text.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ferry: train and run tensors on cpu and cuda, and see what every host<->device crossing costs.\n"
      "Try: ferry devices | ferry plan golden --speedup 250 --compute 0.1s --transfer 0.7s | ferry train",
      "ferry"};
  app.set_version_flag("--version", version_text());
  app.footer(
      "Exit status: 0 done; 1 a runtime failure (a file, a device, a non-finite loss); 2 bad usage or input;\n"
      "130 / 143 ferry train stopped by Ctrl-C / SIGTERM after the step in progress (with --checkpoint, saved there).");
  app.require_subcommand(1);
  // An option given twice takes its last value, as getopt and argparse do (`ferry train $DEFAULTS --epochs 1`).
  // Set before the commands are added: their options inherit it.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.fallthrough(false);
  // The settings in the environment are read at their first use: the sim device's (FERRY_SIM_LINK, FERRY_SIM_DEVICES)
  // when a sim device is, the layer switches when a layer runs, FERRY_READY_EVENTS at the first loss. So a bad value went unnoticed by a command that used
  // no sim device (train --device cpu, eval, plan), or stopped a run after its first lines. Checked here, after the
  // command line is parsed and before any command runs, like an option (exit 2). inspect and convert read and write
  // files only. (The cuda backend's own variables, FERRY_CUDNN and FERRY_STAGING_*, are checked at its first use.)
  app.parse_complete_callback([&app] {
    if (app.got_subcommand("inspect") || app.got_subcommand("convert")) return;
    (void)ferry::sim_link_bandwidth();  // throws InvalidArgument for a bad FERRY_SIM_LINK or FERRY_SIM_DEVICES
    (void)ferry::nn::functional::fused_activations();  // FERRY_FUSED_ACTIVATIONS, a switch (1/0, on/off, ...)
    (void)ferry::nn::functional::library_layers();     // FERRY_LIBRARY_LAYERS
    (void)ferry::nn::functional::onednn();             // FERRY_ONEDNN
    (void)ferry::deterministic_algorithms();           // FERRY_DETERMINISTIC
    (void)ferry::ready_events_enabled();               // FERRY_READY_EVENTS
    (void)ferry::host_parallel_work_scale();           // FERRY_PARALLEL_SCALE, a whole number from 1 to 4096
  });
  register_devices_command(app);
  register_plan_command(app);
  register_bench_command(app);
  register_train_command(app);
  register_eval_command(app);
  register_inspect_command(app);
  register_convert_command(app);
  // A first word that is no command: say so and list them (CLI11 alone says "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* command : app.get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + command->get_name();
      known = known || command->check_name(argv[1]);
    }
    if (!known) {
      say("error: ", ("unknown command '" + ferry::detail::printable(argv[1]) + "'; the commands are " + names +
                      " (see ferry --help)").c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    say("error: ", (std::string(e.what()) + " (see ferry --help)").c_str());
    return 2;
  } catch (const ferry::Interrupted& e) {  // stopped cleanly on request: the shell's status for that signal
    if (*e.what() != '\0') say("", e.what());
    return 128 + e.signal();
  } catch (const ferry::nn::StateDictError& e) {
    // Tensors that do not fit the model their checkpoint names: a damaged file. (A --model that differs from the
    // checkpoint's is refused before any loading, as bad usage.)
    say("error: ", e.what());
    return 1;
  } catch (const ferry::InvalidArgument& e) {
    say("error: ", e.what());
    return 2;
  } catch (const ferry::DeviceUnavailable& e) {
    say("error: ", e.what());
    return 2;
  } catch (const ferry::Error& e) {
    say("error: ", e.what());
    return 1;
  } catch (const std::exception& e) {
    say("unexpected error: ", e.what());
    return 1;
  }
  return 0;
}
