// The `kiln` command. Everything lives in app.cc; see docs/cli.md.
#include <iostream>
#include <string>
#include <vector>

#include "kiln/cli/app.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  return kiln::cli::RunKiln(args, std::cout, std::cerr);
}
