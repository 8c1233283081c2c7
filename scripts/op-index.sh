#!/usr/bin/env bash
# Prints, for every op in src/kiln/ir/opcodes.def (or just the ones named), where its pieces are:
# shape rule, reference kernel, cpu kernel and VJP rule, found through the `// ---- <op> ----`
# markers those files carry.
#   scripts/op-index.sh            # every op
#   scripts/op-index.sh conv2d     # one op
#   scripts/op-index.sh --check    # exit 1 if any op lacks a piece (run by CTest: op_index_check)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
ops=("$@")
if [ ${#ops[@]} -eq 0 ]; then
  mapfile -t ops < <(grep '^KILN_OP' src/kiln/ir/opcodes.def | sed 's/.*"\(.*\)".*/\1/')
fi
where() {  # $1 = op, $2.. = dirs or files
  local op=$1; shift
  grep -rn --include='*.cc' -- "// ---- ${op} ----" "$@" 2>/dev/null | cut -d: -f1,2 | paste -sd' ' || true
}
enum_of() {  # conv2d_backward_input -> kConv2dBackwardInput
  echo "$1" | awk -F_ '{s="k"; for(i=1;i<=NF;i++) s=s toupper(substr($i,1,1)) substr($i,2); print s}'
}
missing=0
for op in "${ops[@]}"; do
  shape=$(where "$op" src/kiln/ir/shape_inference*.cc)
  ref=$(where "$op" src/kiln/runtime/reference)
  cpu=$(where "$op" src/kiln/runtime/cpu)
  vjp=$(where "$op" src/kiln/autodiff/vjp_rules.cc)
  if [ -z "$vjp" ] && grep -A1 "case Opcode::$(enum_of "$op"):" src/kiln/autodiff/vjp_rules.cc |
      grep -q 'return nullptr'; then
    vjp="not differentiable (src/kiln/autodiff/vjp_rules.cc: FindVjpRule)"
  fi
  case "$op" in parameter|constant) [ -n "$cpu" ] || cpu="no kernel (bound or stored at compile time)";; esac
  if [ $check -eq 1 ]; then
    for piece in shape ref cpu vjp; do
      if [ -z "${!piece}" ]; then echo "op '$op' has no $piece marker"; missing=1; fi
    done
  else
    echo "$op"
    echo "  shape rule : $shape"
    echo "  reference  : $ref"
    echo "  cpu        : $cpu"
    echo "  vjp        : $vjp"
  fi
done
exit $missing
