// Parses IR text (docs/ir.md) into a verified Graph. Malformed text gives InvalidArgument naming
// the line and column and what was expected; it never crashes.
#ifndef KILN_IR_PARSER_H_
#define KILN_IR_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

absl::StatusOr<Graph> ParseGraph(std::string_view text);

}  // namespace kiln::ir

#endif  // KILN_IR_PARSER_H_
