#include "kiln/cli/app.h"

#include <exception>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/demo.h"
#include "kiln/cli/ir_commands.h"
#include "kiln/cli/train_cmd.h"

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0-unknown"
#endif

namespace kiln::cli {
namespace {

// A failed command: "kiln <cmd>: <message>" on err, exit code 1.
int Fail(std::ostream& err, const std::string& command, const absl::Status& s) {
  err << "kiln " << command << ": " << s.message() << "\n";
  return 1;
}

}  // namespace

const char* KilnVersion() { return KILN_VERSION; }

int RunKiln(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    CLI::App app{"Kiln: an ML graph compiler and runtime (see docs/cli.md)", "kiln"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("kiln ") + KILN_VERSION);

    CLI::App* version = app.add_subcommand("version", "Print the version of kiln");

    // Numeric ranges are checked by RunDemo, whose messages name the flag and the rule.
    DemoOptions demo_opts;
    CLI::App* demo = app.add_subcommand(
        "demo",
        "Train an MLP on the digits data through the engine (autodiff + SGD in one compiled "
        "train-step graph) and report the held-out accuracy");
    demo->add_option("--data", demo_opts.data,
                     "Digits CSV (.csv or .csv.gz): 64 pixels 0..16 then the label, no header")
        ->capture_default_str();
    demo->add_option("--steps", demo_opts.steps, "Training steps")->capture_default_str();
    demo->add_option("--batch", demo_opts.batch, "Examples per step")->capture_default_str();
    demo->add_option("--lr", demo_opts.lr, "SGD learning rate")->capture_default_str();
    demo->add_option("--hidden", demo_opts.hidden,
                     "Hidden layer widths, comma-separated (e.g. 128,64)")
        ->delimiter(',')
        ->capture_default_str();
    demo->add_option("--seed", demo_opts.seed, "Seed for the split, shuffling and init")
        ->capture_default_str();
    demo->add_option("--backend", demo_opts.backend, "Backend: cpu (oneDNN) or reference")
        ->check(CLI::IsMember(BackendNames()))
        ->capture_default_str();
    demo->add_option("--held-out", demo_opts.held_out_fraction,
                     "Fraction of the rows held out for evaluation")
        ->capture_default_str();
    demo->add_option("--log-every", demo_opts.log_every,
                     "Print the loss every N steps (0: about 10 lines)")
        ->capture_default_str();
    demo->add_option("--dump-ir", demo_opts.dump_ir,
                     "Write the compiled train-step graph as IR text to this file");

    CLI::App* ir = app.add_subcommand("ir", "Work with IR text files (docs/ir.md)");
    ir->require_subcommand(1);
    std::string ir_path;
    CLI::App* ir_print =
        ir->add_subcommand("print", "Parse and verify FILE, then print it in canonical form");
    ir_print->add_option("file", ir_path, "IR text file, or - for stdin")->required();
    CLI::App* ir_check =
        ir->add_subcommand("check", "Parse and verify FILE; print a summary or the error");
    ir_check->add_option("file", ir_path, "IR text file, or - for stdin")->required();

    // `kiln train`, `kiln eval`, `kiln export` (train_cmd.h).
    TrainCommands train_cmds(app);

    std::vector<std::string> storage(args);
    if (storage.empty()) storage.push_back("kiln");
    std::vector<char*> argv;
    for (std::string& a : storage) argv.push_back(a.data());
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const CLI::ParseError& e) {
      return app.exit(e, out, err);
    }

    if (*version) {
      out << "kiln " << KILN_VERSION << "\n";
      return 0;
    }
    if (*demo) {
      absl::StatusOr<DemoResult> r = RunDemo(demo_opts, out);
      return r.ok() ? 0 : Fail(err, "demo", r.status());
    }
    if (int rc = train_cmds.Run(storage, out, err); rc >= 0) return rc;
    if (*ir_print) {
      absl::Status s = IrPrint(ir_path, std::cin, out);
      return s.ok() ? 0 : Fail(err, "ir print", s);
    }
    if (*ir_check) {
      absl::Status s = IrCheck(ir_path, std::cin, out);
      return s.ok() ? 0 : Fail(err, "ir check", s);
    }
    err << "kiln: no command given\n";
    return 1;
  } catch (const std::exception& e) {
    // Nothing below should throw; this keeps a library exception (e.g. bad_alloc) a message.
    err << "kiln: internal error: " << e.what() << "\n";
    return 70;
  }
}

}  // namespace kiln::cli
