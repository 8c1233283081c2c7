#!/usr/bin/env bash
# Prints, for every op in src/kiln/ir/opcodes.def (or just the ones named), where its pieces are:
# shape rule, builder function, reference kernel, cpu kernel and VJP rule, found through the
# `// ---- <op> ----` markers each of those files carries.
#   scripts/op-index.sh            # every op
#   scripts/op-index.sh conv2d     # one op
set -euo pipefail
cd "$(dirname "$0")/.."
ops=("$@")
if [ ${#ops[@]} -eq 0 ]; then
  mapfile -t ops < <(grep '^KILN_OP' src/kiln/ir/opcodes.def | sed 's/.*"\(.*\)".*/\1/')
fi
where() {  # $1 = op, $2.. = dirs or files
  local op=$1; shift
  grep -rn --include='*.cc' -- "// ---- ${op} ----" "$@" 2>/dev/null | cut -d: -f1,2 | paste -sd' ' || true
}
for op in "${ops[@]}"; do
  echo "$op"
  echo "  shape rule : $(where "$op" src/kiln/ir/shape_inference*.cc)"
  echo "  reference  : $(where "$op" src/kiln/runtime/reference)"
  echo "  cpu        : $(where "$op" src/kiln/runtime/cpu)"
  echo "  vjp        : $(where "$op" src/kiln/autodiff)"
done
