#!/bin/sh
# plugin_1_0.sh TESSERA PLUGIN_DIR JOB.ini OUTDIR: a dp plugin built against the 1.0 SDK alone
# (sdk-1.0/, into PLUGIN_DIR) under the current core.
#   1. PLUGIN_DIR comes first on the search path and the loader reads that file's descriptor as
#      ABI 1.0: the job below runs the 1.0 build, not the tree's dp.
#   2. JOB (dp over 2 ranks) for 4 steps equals the same job on 1 rank: the dump (logits, loss,
#      gradients, parameters after AdamW) at rtol/atol 1e-4, each step's loss to 1e-4 relative.
#   3. tessera conform passes on the 1.0 build.
set -eu
bin=$1 plugdir=$2 job=$3 dir=$4
mkdir -p "$dir"
TESSERA_PLUGIN_PATH=$plugdir
export TESSERA_PLUGIN_PATH

"$bin" plugins >"$dir/plugins.txt"
awk -v want="$plugdir/libtessera-dp.so" '
  $1 == "dp" && $NF == want { found = 1; if ($3 != "ABI" || $4 != "1.0") bad = $0 }
  END {
    if (!found) { print "the 1.0 dp build is not the dp on the search path:"; exit 1 }
    if (bad != "") { print "the 1.0 dp build does not report ABI 1.0: " bad; exit 1 }
  }' "$dir/plugins.txt" || { cat "$dir/plugins.txt"; exit 1; }
echo "dp on the search path: $plugdir/libtessera-dp.so, ABI 1.0"

"$bin" run "$job" --no-peak --no-progress --set job.steps=4 --json \
  --dump "$dir/dp2.safetensors" >"$dir/dp2.json"
"$bin" run "$job" --no-peak --no-progress --set job.steps=4 --set mesh.shape=1 --json \
  --dump "$dir/one.safetensors" >"$dir/one.json"
"$bin" compare "$dir/dp2.safetensors" "$dir/one.safetensors" --rtol 1e-4 --atol 1e-4
losses() { sed -n 's/.*"loss": \([-0-9.e]*\),.*/\1/p' "$1"; }
losses "$dir/dp2.json" >"$dir/dp2.loss"
losses "$dir/one.json" >"$dir/one.loss"
awk 'NR == FNR { one[FNR] = $1; next }
  { n++; d = $1 - one[FNR]; if (d < 0) d = -d; r = d / (one[FNR] < 0 ? -one[FNR] : one[FNR]);
    printf "step %d: dp %s  1 rank %s  rel %.2e\n", FNR, $1, one[FNR], r; if (r > 1e-4) bad = 1 }
  END { if (n != 4) { print "expected 4 losses, got " n; exit 1 } exit bad }' \
  "$dir/one.loss" "$dir/dp2.loss"

"$bin" conform "$plugdir/libtessera-dp.so"
echo "abi_plugin_1_0: the 1.0 dp build runs, equals 1 rank and conforms"
