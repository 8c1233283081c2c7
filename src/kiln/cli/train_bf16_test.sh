#!/bin/sh
# `kiln train --set precision=mixed_bf16` end to end (CTest kiln_train_mixed_bf16, and its
# _isa_avx2 / _isa_sse41 / _isa_avx512 reruns under KILN_CPU_ISA): a short run of the CNN config
# (bf16 matmuls, convolutions and their gradients) must finish with a finite training loss that
# fell. Where oneDNN has no bf16 kernels (below avx512_core: KILN_CPU_ISA=avx2 or sse41, or such a
# host) kiln train must say, once, which ops computed in f32 and why, next to the rate warning;
# where it has them neither line may appear.
# usage: train_bf16_test.sh KILN CONFIG WORKDIR
set -u
KILN=$1; CONFIG=$2; W=$3
rm -rf "$W"; mkdir -p "$W"
fail() { echo "FAIL: $*"; exit 1; }

# A cache of its own: the pipeline runs here, not a hit on an entry of another run.
KILN_CACHE_DIR="$W/cache" "$KILN" train "$CONFIG" --set precision=mixed_bf16 --set steps=60 \
  --set log_every=20 --set eval_every=0 --set checkpoint_every=60 --output-dir "$W/run" \
  > "$W/train.log" 2>&1
rc=$?
cat "$W/train.log"
test "$rc" -eq 0 || fail "kiln train exited $rc"

# The logged losses ("step 20/60 loss 2.2836 ..."): every one finite, the last below the first.
grep -q '^done: step 60' "$W/train.log" || fail "no 'done: step 60' line"
awk '/^step [0-9]+\/[0-9]+ loss / {
       n++; v = $4
       if (v !~ /^[0-9.]+$/) { print "non-finite loss " v; bad = 1 }   # nan, inf
       if (n == 1) first = v; last = v
     }
     END { if (bad || n < 2 || !(last < first)) { print n " losses, " first " -> " last; exit 1 } }' \
  "$W/train.log" || fail "the training loss is not finite and falling"

note='compute in f32 with bf16 storage: oneDNN has no bf16 matmul/convolution below avx512_core'
notes=$(grep -c "$note" "$W/train.log")
warned=$(grep -c 'kiln train: warning: .*so bf16 matmuls and convolutions compute in f32 here' \
  "$W/train.log")
case "${KILN_CPU_ISA:-native}" in
  sse41|avx2) expect=1 ;;
  native) expect=$warned ;;  # the host decides: its rate warning says whether oneDNN has bf16
  *) expect=0 ;;             # avx512 and up: oneDNN's bf16 kernels run
esac
test "$notes" -eq "$expect" || fail "expected $expect f32-compute line(s), found $notes"
test "$warned" -eq "$expect" || fail "expected $expect computes-in-f32 warning(s), found $warned"
if [ "$expect" -eq 1 ]; then
  grep "$note" "$W/train.log" | grep -q '^precision mixed_bf16 on .*conv2d.*dot_general' \
    || fail "the f32-compute line does not name the convolutions and matmuls"
fi
grep -q '"bf16_computes_in_f32": '"$([ "$expect" -eq 1 ] && echo true || echo false)" \
  "$W/run/run.json" || fail "run.json matmul_gflops.bf16_computes_in_f32 disagrees"
# Again from the compile cache (the optimized step read back, no pass run): the same line, read off
# the cached program's float_normalized attributes.
# (The same config: the schedule is part of the step graph.)
KILN_CACHE_DIR="$W/cache" "$KILN" train "$CONFIG" --set precision=mixed_bf16 --set steps=60 \
  --set log_every=20 --set eval_every=0 --set checkpoint_every=60 --output-dir "$W/run2" \
  > "$W/train2.log" 2>&1 \
  || { cat "$W/train2.log"; fail "the cached rerun exited $?"; }
grep -q "miss for graph '[a-z]*_loss_train_step'" "$W/train2.log" \
  && { cat "$W/train2.log"; fail "the rerun missed the compile cache"; }
test "$(grep -c "$note" "$W/train2.log")" -eq "$expect" \
  || { cat "$W/train2.log"; fail "the cached rerun does not report the f32-compute ops the same"; }
echo "PASS (KILN_CPU_ISA=${KILN_CPU_ISA:-native}, f32-compute lines: $notes)"
