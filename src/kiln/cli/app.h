// The `kiln` command line: subcommands, flag parsing (CLI11) and error reporting. main.cc only
// forwards argv here; tests call RunKiln with their own streams.
//
//   std::ostringstream out, err;
//   int rc = RunKiln({"kiln", "demo", "--steps", "150"}, out, err);
//
// Every failure (bad flags, missing files, engine errors) is a message on `err` and a non-zero
// return: 1 for a failed command, CLI11's code (e.g. 105 for an invalid flag value, 109 for an
// unknown argument) for a usage error. Nothing throws out of RunKiln.
#ifndef KILN_CLI_APP_H_
#define KILN_CLI_APP_H_

#include <ostream>
#include <string>
#include <vector>

namespace kiln::cli {

// args[0] is the program name.
int RunKiln(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// "0.1.0"
const char* KilnVersion();

}  // namespace kiln::cli

#endif  // KILN_CLI_APP_H_
