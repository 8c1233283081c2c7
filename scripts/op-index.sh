#!/usr/bin/env bash
# Prints, for every op in src/kiln/ir/opcodes.def (or just the ones named), where its pieces are,
# found through the code itself (no markers): its table row, its shape rule (a `case Opcode::kFoo`
# in shape_inference*.cc, or the family rule InferUnary/InferBinary its `family` column selects),
# its reference kernel (the `case F::k<family>` of MakeKernel in eval/kernels.cc, plus
# the op's own cases in eval/ and its per-element rule in ir/element_semantics.cc), its cpu lowering (the `case F::k<family>` of LowerNode in
# cpu_backend.cc, plus the op's own cases in runtime/cpu/) and its VJP rule (the function
# FindVjpRule returns for it, or "not differentiable").
#   scripts/op-index.sh            # every op
#   scripts/op-index.sh conv2d     # one op
#   scripts/op-index.sh --check    # exit 1 if any op lacks a piece (run by CTest: op_index_check)
# A name that is not an op is an error (exit 2) with the nearest op names.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
cases='case Opcode::k[A-Za-z0-9]+:'
{
  # OP <Enum> <name> <def line> <family>
  grep -n '^KILN_OP(' src/kiln/ir/opcodes.def |
    sed -E 's/^([0-9]+):KILN_OP\(([A-Z][A-Za-z0-9]*), "([a-z0-9_]+)", *-?[0-9]+, *k[A-Za-z]+, *(k[A-Za-z]+),.*/OP k\2 \3 \1 \4/'
  # CASE <file:line> <Enum> for every opcode case outside tests.
  grep -rnE --include='*.cc' "$cases" src/kiln/ir src/kiln/eval src/kiln/runtime |
    grep -v '_test\.cc:' | sed -E 's/^([^:]*):([0-9]+):.*case Opcode::(k[A-Za-z0-9]+):.*/CASE \1:\2 \3/'
  # FAMILY <family> <file:line>: LowerNode's cases in the cpu backend.
  grep -nE 'case F::k[A-Za-z]+:' src/kiln/runtime/cpu/cpu_backend.cc |
    sed -E 's/^([0-9]+):.*case F::(k[A-Za-z]+):.*/FAMILY \2 src\/kiln\/runtime\/cpu\/cpu_backend.cc:\1/'
  # REFFAMILY <family> <file:line>: MakeKernel's cases in the reference kernels.
  grep -nE 'case F::k[A-Za-z]+:' src/kiln/eval/kernels.cc |
    sed -E 's/^([0-9]+):.*case F::(k[A-Za-z]+):.*/REFFAMILY \2 src\/kiln\/eval\/kernels.cc:\1/'
  # RULE <name> <file:line>: the shape rules for the plain elementwise families.
  grep -nE '^absl::StatusOr<Type> Infer(Unary|Binary)\(' src/kiln/ir/shape_inference.cc |
    sed -E 's/^([0-9]+):absl::StatusOr<Type> (Infer[A-Za-z]+)\(.*/RULE \2 src\/kiln\/ir\/shape_inference.cc:\1/'
  # VJP <Enum> <function or "none">, from FindVjpRule's cases (fall-through groups share a rule).
  awk '/^VjpRule FindVjpRule/ { on = 1 } on && /^}/ { on = 0 }
       on && /case Opcode::k[A-Za-z0-9]*:/ { c = $0; sub(/.*case Opcode::/, "", c); sub(/:.*/, "", c); pend = pend " " c; next }
       on && /return &[A-Za-z0-9]*;/ { f = $0; sub(/.*return &/, "", f); sub(/;.*/, "", f); n = split(pend, p, " "); for (i = 1; i <= n; i++) print "VJP " p[i] " " f; pend = ""; next }
       on && /return nullptr/ { n = split(pend, p, " "); for (i = 1; i <= n; i++) print "VJP " p[i] " none"; pend = "" }' src/kiln/autodiff/vjp_rules.cc
  # VJPDEF <function> <file:line>
  grep -nE '^(absl::)?StatusOr<Cotangents> [A-Za-z0-9]+Vjp\(' src/kiln/autodiff/vjp_rules.cc |
    sed -E 's/^([0-9]+):(absl::)?StatusOr<Cotangents> ([A-Za-z0-9]+)\(.*/VJPDEF \3 src\/kiln\/autodiff\/vjp_rules.cc:\1/'
} | awk -v check="$check" -v want="$*" '
  function add(op, piece, loc) { found[op, piece] = (found[op, piece] == "" ? loc : found[op, piece] " " loc) }
  $1 == "OP" { n++; name[n] = $3; enum_of[$3] = $2; op_of[$2] = $3; row[$3] = "src/kiln/ir/opcodes.def:" $4; family[$3] = $5; next }
  $1 == "CASE" {
    loc = $2; op = op_of[$3]
    if (op == "") next
    if (loc ~ /^src\/kiln\/ir\/shape_inference/) add(op, "shape", loc)
    else if (loc ~ /^src\/kiln\/eval\// || loc ~ /^src\/kiln\/ir\/element_semantics/) add(op, "reference", loc)
    else if (loc ~ /^src\/kiln\/runtime\/cpu\//) add(op, "cpu", loc)
    next
  }
  $1 == "FAMILY" { lower[$2] = $3; next }
  $1 == "REFFAMILY" { refmake[$2] = $3; next }
  $1 == "RULE" { rule[$2] = $3; next }
  $1 == "VJP" { vjp[op_of[$2]] = $3; next }
  $1 == "VJPDEF" { vjpdef[$2] = $3; next }
  END {
    split(want, w, " "); for (i in w) wanted[w[i]] = 1
    bad = 0
    for (op in wanted) {
      if (op in enum_of) continue
      # Suggest ops that contain the name or that it contains ("conv" -> conv2d, conv2d_grad...).
      near = ""
      for (i = 1; i <= n; i++)
        if (index(name[i], op) || index(op, name[i]) && length(name[i]) > 2)
          near = near (near == "" ? "" : ", ") name[i]
      msg = "op-index.sh: unknown op \x27" op "\x27"
      if (near != "") msg = msg " (did you mean: " near "?)"
      print msg "; ops are the KILN_OP names in src/kiln/ir/opcodes.def (run with no arguments to list them)" > "/dev/stderr"
      bad = 2
    }
    if (bad) exit bad
    for (i = 1; i <= n; i++) {
      op = name[i]; f = family[op]
      if (want != "" && !(op in wanted)) continue
      shape = found[op, "shape"]
      plain = (f == "kUnary" || f == "kBinary" || f == "kCompare" || f == "kLogical")
      if (shape == "" && plain) shape = (f == "kUnary" || op == "logical_not" ? "InferUnary " rule["InferUnary"] : "InferBinary " rule["InferBinary"]) " (family " f ")"
      ref = ""
      if (f == "kNone") ref = "no kernel (bound to a tensor)"
      else if (refmake[f] != "") ref = "MakeKernel family " f " " refmake[f] (found[op, "reference"] == "" ? "" : "; " found[op, "reference"])
      # A unary or binary op needs its own per-element rule: the family only picks the loop.
      if ((f == "kUnary" || f == "kBinary") && found[op, "reference"] == "") ref = ""
      cpu = ""
      if (f == "kNone") cpu = "no kernel (bound or stored at compile time)"
      else if (lower[f] != "") cpu = "LowerNode family " f " " lower[f] (found[op, "cpu"] == "" ? "" : "; " found[op, "cpu"])
      # A unary or binary op needs its own loop kernel: the family only picks oneDNN or the loop.
      if ((f == "kUnary" || f == "kBinary") && found[op, "cpu"] == "") cpu = ""
      v = ""
      if (vjp[op] == "none") v = "not differentiable (src/kiln/autodiff/vjp_rules.cc: FindVjpRule)"
      else if (vjp[op] != "" && vjpdef[vjp[op]] != "") v = vjp[op] " " vjpdef[vjp[op]]
      if (check) {
        if (shape == "") { print "op \x27" op "\x27 has no shape rule (no case in shape_inference*.cc, no family rule)"; bad = 1 }
        if (ref == "") { print "op \x27" op "\x27 has no reference kernel (family " f " has no MakeKernel case, or no per-element case in ir/element_semantics.cc)"; bad = 1 }
        if (cpu == "") { print "op \x27" op "\x27 has no cpu lowering (family " f " has no LowerNode case, or no loop case in runtime/cpu/)"; bad = 1 }
        if (v == "") { print "op \x27" op "\x27 has no VJP rule in FindVjpRule (return nullptr if not differentiable)"; bad = 1 }
      } else {
        print op
        print "  table row  : " row[op] " (family " f ")"
        print "  shape rule : " shape
        print "  reference  : " ref
        print "  cpu        : " cpu
        print "  vjp        : " v
      }
    }
    exit bad
  }'
