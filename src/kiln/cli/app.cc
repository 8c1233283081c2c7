#include "kiln/cli/app.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <optional>
#include <string_view>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kiln/cli/backends.h"
#include "kiln/cli/data_cmd.h"
#include "kiln/cli/demo.h"
#include "kiln/cli/ir_commands.h"
#include "kiln/cli/predict_cmd.h"
#include "kiln/cli/quantize_cmd.h"
#include "kiln/cli/serve_cmd.h"
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

// Optimal string alignment distance: Levenshtein plus swaps of adjacent letters, so the usual
// typos ("trian", "exprot", "evl") are one edit from the command.
int EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// A usage error CLI11 would report badly: a mistyped command ("kiln trian" gets "A subcommand is
// required") or none at all. Walks args down the subcommand tree; a word that names no command
// where one is required gets the nearest names. Returns the exit code after writing the message,
// or nullopt to let CLI11 parse (flags such as --help stop the walk).
std::optional<int> CheckCommandWords(CLI::App& app, const std::vector<std::string>& args,
                                     std::ostream& err) {
  CLI::App* at = &app;
  std::string path = "kiln";
  for (size_t i = 1;; ++i) {
    std::vector<CLI::App*> subs = at->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty() || at->get_require_subcommand_min() == 0) return std::nullopt;
    std::vector<std::string> names;
    for (CLI::App* sub : subs) names.push_back(sub->get_name());
    std::sort(names.begin(), names.end());
    if (i >= args.size()) {
      err << path << ": a command is required: " << absl::StrJoin(names, ", ") << " (" << path
          << " --help describes them)\n";
      return static_cast<int>(CLI::ExitCodes::RequiredError);
    }
    const std::string& word = args[i];
    if (word.empty() || word[0] == '-') return std::nullopt;
    auto it = std::find_if(subs.begin(), subs.end(),
                           [&](CLI::App* sub) { return sub->check_name(word); });
    if (it != subs.end()) {
      at = *it;
      absl::StrAppend(&path, " ", word);
      continue;
    }
    // The closest names within a third of the word's length (at least 1 edit), or those it
    // begins ("exp" -> export).
    int best = std::max<int>(1, static_cast<int>(word.size()) / 3);
    std::vector<std::string> near;
    for (const std::string& name : names) {
      int dist = EditDistance(word, name);
      if (name.rfind(word, 0) == 0 && word.size() >= 2) dist = std::min(dist, best);
      if (dist < best) near.clear();
      if (dist <= best) {
        best = dist;
        near.push_back(name);
      }
    }
    err << path << ": unknown command '" << word << "'";
    if (!near.empty()) {
      err << "; did you mean '" << absl::StrJoin(near, "' or '") << "'?\n";
    } else {
      err << "; the commands are " << absl::StrJoin(names, ", ") << " (" << path
          << " --help describes them)\n";
    }
    return static_cast<int>(CLI::ExitCodes::ExtrasError);
  }
}

}  // namespace

const char* KilnVersion() { return KILN_VERSION; }

int RunKiln(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  // The CPU ISA level is process-wide and fixed at its first use: capped before any command.
  if (absl::Status isa = ApplyCpuIsaFromEnvironment(); !isa.ok()) {
    err << "kiln: " << isa.message() << "\n";
    return 2;
  }
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
                     "Digits CSV (.csv or .csv.gz): 64 pixels 0..16 then the label, no header. "
                     "Default: examples/data/digits.csv.gz, looked for under the current "
                     "directory, above the kiln binary and in the source tree");
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
    // `kiln predict` (predict_cmd.h).
    PredictCommand predict_cmd(app);
    // `kiln quantize` (quantize_cmd.h).
    QuantizeCommand quantize_cmd(app);
    // `kiln serve` (serve_cmd.h).
    ServeCommand serve_cmd(app);
    // `kiln data import ...`, `kiln data inspect` (data_cmd.h).
    DataCommands data_cmds(app);

    std::vector<std::string> storage(args);
    if (storage.empty()) storage.push_back("kiln");
    std::vector<char*> argv;
    for (std::string& a : storage) argv.push_back(a.data());
    if (std::optional<int> rc = CheckCommandWords(app, storage, err)) return *rc;
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
    if (int rc = predict_cmd.Run(out, err); rc >= 0) return rc;
    if (int rc = quantize_cmd.Run(out, err); rc >= 0) return rc;
    if (int rc = serve_cmd.Run(out, err); rc >= 0) return rc;
    if (int rc = data_cmds.Run(out, err); rc >= 0) return rc;
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
