// Prints a Graph as IR text that ParseGraph (parser.h) reads back to an identical graph.
// The format is specified in docs/ir.md.
#ifndef KILN_IR_PRINTER_H_
#define KILN_IR_PRINTER_H_

#include <string>

#include "kiln/ir/graph.h"

namespace kiln::ir {

std::string PrintGraph(const Graph& graph);

}  // namespace kiln::ir

#endif  // KILN_IR_PRINTER_H_
