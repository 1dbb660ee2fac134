// main.cpp — the ferry command line. The one place where errors become exit codes:
// 0 success, 1 a runtime failure (file, device, numerics), 2 bad usage or bad input.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "ferry/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ferry: train and run tensors on cpu and cuda, and see what every host<->device crossing costs.\n"
      "Try: ferry devices | ferry plan golden --speedup 250 --compute 0.1s --transfer 0.7s | ferry train",
      "ferry"};
  app.require_subcommand(1);
  app.fallthrough(false);
  register_devices_command(app);
  register_plan_command(app);
  register_bench_command(app);
  register_train_command(app);
  register_eval_command(app);
  register_inspect_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "ferry: error: %s (see ferry --help)\n", e.what());
    return 2;
  } catch (const ferry::InvalidArgument& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 2;
  } catch (const ferry::DeviceUnavailable& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 2;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
