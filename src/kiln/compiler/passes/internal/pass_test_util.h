// Test helpers for passes: IR text in, printed IR checked out (tests only; needs gtest).
//
//   AlgebraicSimplifierPass pass;
//   ExpectRewrite(pass, R"(graph @g { ... })", R"(graph @g { ... })");   // changed, exact output
//   ExpectUnchanged(pass, R"(graph @g { ... })");
//
// The expected text is parsed and printed before comparing, so it may use any value names, leave
// out inferred types and list attributes in any order; the comparison is then exact. Every check
// also verifies the output (ir::Verify) and that a second run changes nothing (idempotence).
#ifndef KILN_COMPILER_PASSES_INTERNAL_PASS_TEST_UTIL_H_
#define KILN_COMPILER_PASSES_INTERNAL_PASS_TEST_UTIL_H_

#include <string>
#include <string_view>

#include "gtest/gtest.h"
#include "kiln/compiler/pass.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/verifier.h"

namespace kiln::compiler::testing {

// The canonical printed form of `text`; fails the test (and returns "") if it does not parse.
inline std::string Canonical(std::string_view text) {
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << "expected IR does not parse: " << g.status() << "\n" << text;
  return g.ok() ? ir::PrintGraph(*g) : std::string();
}

struct PassOutcome {
  bool ok = false;
  bool changed = false;
  std::string text;  // the printed result
};

// Parses `text`, runs `pass`, verifies the result and runs the pass again to check idempotence.
inline PassOutcome RunOnText(Pass& pass, std::string_view text) {
  PassOutcome out;
  absl::StatusOr<ir::Graph> g = ir::ParseGraph(text);
  EXPECT_TRUE(g.ok()) << "input IR does not parse: " << g.status() << "\n" << text;
  if (!g.ok()) return out;
  absl::StatusOr<bool> changed = pass.Run(*g);
  EXPECT_TRUE(changed.ok()) << pass.name() << ": " << changed.status();
  if (!changed.ok()) return out;
  out.changed = *changed;
  out.text = ir::PrintGraph(*g);
  absl::Status v = ir::Verify(*g);
  EXPECT_TRUE(v.ok()) << pass.name() << " produced an invalid graph: " << v << "\n" << out.text;
  absl::StatusOr<bool> again = pass.Run(*g);
  EXPECT_TRUE(again.ok()) << again.status();
  if (again.ok()) {
    EXPECT_FALSE(*again) << pass.name() << " is not idempotent; after one run:\n"
                         << out.text << "after two:\n"
                         << ir::PrintGraph(*g);
  }
  out.ok = v.ok() && again.ok();
  return out;
}

inline void ExpectRewrite(Pass& pass, std::string_view in, std::string_view expected) {
  PassOutcome r = RunOnText(pass, in);
  EXPECT_TRUE(r.changed) << pass.name() << " did not change:\n" << in;
  EXPECT_EQ(r.text, Canonical(expected));
}

inline void ExpectUnchanged(Pass& pass, std::string_view in) {
  PassOutcome r = RunOnText(pass, in);
  EXPECT_FALSE(r.changed) << pass.name() << " changed it to:\n" << r.text;
  EXPECT_EQ(r.text, Canonical(in));
}

}  // namespace kiln::compiler::testing

#endif  // KILN_COMPILER_PASSES_INTERNAL_PASS_TEST_UTIL_H_
