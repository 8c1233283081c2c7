#include "kiln/cli/ir_commands.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "kiln/base/status.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::cli {

absl::StatusOr<ir::Graph> LoadIrFile(const std::string& path, std::istream& in) {
  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
      const int err = errno;
      const std::string msg = absl::StrCat("cannot open ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
    }
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const std::string name = path == "-" ? "<stdin>" : path;
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  if (!g.ok()) return Annotate(g.status(), name);
  // The parser verifies; checking again costs little and keeps `check` honest if that changes.
  absl::Status v = ir::Verify(*g);
  if (!v.ok()) return Annotate(v, name);
  return g;
}

absl::Status IrPrint(const std::string& path, std::istream& in, std::ostream& out) {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, LoadIrFile(path, in));
  out << ir::PrintGraph(g);
  return absl::OkStatus();
}

absl::Status IrCheck(const std::string& path, std::istream& in, std::ostream& out) {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, LoadIrFile(path, in));
  out << (path == "-" ? "<stdin>" : path) << ": ok: graph @" << g.name() << ", " << g.num_nodes()
      << " nodes (" << g.parameters().size() << " parameters), " << g.outputs().size()
      << " outputs\n";
  return absl::OkStatus();
}

}  // namespace kiln::cli
