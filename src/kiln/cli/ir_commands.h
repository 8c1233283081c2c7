// `kiln ir print FILE` and `kiln ir check FILE`: parse (and verify) an IR text file (docs/ir.md).
// print writes the canonical text back; check prints a one-line summary. "-" reads stdin.
//
//   absl::Status s = IrPrint("model.kir", std::cout);   // InvalidArgument "model.kir:3:7: ..."
#ifndef KILN_CLI_IR_COMMANDS_H_
#define KILN_CLI_IR_COMMANDS_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::cli {

// Reads and parses `path` ("-" = `in`); the parser verifies the graph. Errors name the file.
absl::StatusOr<ir::Graph> LoadIrFile(const std::string& path, std::istream& in);

absl::Status IrPrint(const std::string& path, std::istream& in, std::ostream& out);
// "FILE: ok: graph @name, N nodes (P parameters), O outputs"
absl::Status IrCheck(const std::string& path, std::istream& in, std::ostream& out);

}  // namespace kiln::cli

#endif  // KILN_CLI_IR_COMMANDS_H_
