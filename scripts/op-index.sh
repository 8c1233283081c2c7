#!/usr/bin/env bash
# Prints, for every op in src/kiln/ir/opcodes.def (or just the ones named), where its pieces are:
# shape rule, reference kernel, cpu kernel and VJP rule, found through the `// ---- <op> ----`
# markers those files carry.
#   scripts/op-index.sh            # every op
#   scripts/op-index.sh conv2d     # one op
#   scripts/op-index.sh --check    # exit 1 if any op lacks a piece (run by CTest: op_index_check)
# A name that is not an op is an error (exit 2) with the nearest op names.
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
# One grep collects every marker and the VJP switch; one awk program does the rest.
{
  grep '^KILN_OP' src/kiln/ir/opcodes.def | sed 's/^KILN_OP(\([A-Za-z0-9]*\), "\([a-z0-9_]*\)".*/OP \1 \2/'
  grep -rn --include='*.cc' -- '// ---- ' src/kiln | sed 's/^\([^:]*:[0-9]*\):.*\/\/ ---- \(.*\) ----.*/MARK \1 \2/'
  # A "case Opcode::kFoo:" directly followed by "return nullptr" in FindVjpRule: no VJP by design.
  awk '/case Opcode::k[A-Za-z0-9]*:/ { c = $0; sub(/.*case Opcode::/, "", c); sub(/:.*/, "", c); next }
       /return nullptr/ && c != "" { print "NODIFF " c } { c = "" }' src/kiln/autodiff/vjp_rules.cc
} | awk -v check="$check" -v want="$*" '
  $1 == "OP" { n++; name[n] = $3; enum_of[$3] = $2; next }
  $1 == "MARK" {
    loc = $2; op = $3
    if (NF > 3) next   # "softmax (decomposition)" and similar: not one of the four pieces
    if (loc ~ /^src\/kiln\/ir\/shape_inference/) piece = "shape"
    else if (loc ~ /^src\/kiln\/runtime\/reference\//) piece = "reference"
    else if (loc ~ /^src\/kiln\/runtime\/cpu\//) piece = "cpu"
    else if (loc ~ /^src\/kiln\/autodiff\/vjp_rules.cc/) piece = "vjp"
    else next
    found[op, piece] = (found[op, piece] == "" ? loc : found[op, piece] " " loc)
    next
  }
  $1 == "NODIFF" { nodiff[$2] = 1; next }
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
      op = name[i]
      if (want != "" && !(op in wanted)) continue
      if (found[op, "vjp"] == "" && (enum_of[op] in nodiff))
        found[op, "vjp"] = "not differentiable (src/kiln/autodiff/vjp_rules.cc: FindVjpRule)"
      if (found[op, "cpu"] == "" && (op == "parameter" || op == "constant"))
        found[op, "cpu"] = "no kernel (bound or stored at compile time)"
      if (check) {
        split("shape reference cpu vjp", pieces, " ")
        for (p = 1; p <= 4; p++)
          if (found[op, pieces[p]] == "") { print "op \x27" op "\x27 has no " pieces[p] " marker"; bad = 1 }
      } else {
        print op
        print "  shape rule : " found[op, "shape"]
        print "  reference  : " found[op, "reference"]
        print "  cpu        : " found[op, "cpu"]
        print "  vjp        : " found[op, "vjp"]
      }
    }
    exit bad
  }'
