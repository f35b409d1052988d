#!/bin/sh
# Tessera's training step against PyTorch eager on the same preset and thread count, run one after
# the other on this machine, and the ratio of their tokens/s.
#
#   bench/compare_pytorch.sh [BUILD_DIR] [THREADS] [ROUNDS]      defaults: build, 2, 1
#
# Each round runs both benchmarks back to back and prints their ratio; with several rounds the
# last line gives the range of the ratios (on a shared machine a single round can be off by tens
# of percent, so quote the range, not one figure).
#
# PyTorch is Debian's python3-torch: PYTHON (default /usr/bin/python3, the interpreter the Debian
# package installs into) must import torch.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
threads=${2:-2}
rounds=${3:-1}
python=${PYTHON:-/usr/bin/python3}
bench="$build/bench/bench_train"
[ -x "$bench" ] || { echo "compare_pytorch.sh: $bench not built (cmake --build $build)" >&2; exit 2; }
"$python" -c "import torch" 2>/dev/null ||
  { echo "compare_pytorch.sh: $python cannot import torch (apt-get install python3-torch)" >&2; exit 2; }

# Both sides get the same thread count from the start: OpenBLAS and OpenMP read these when they
# load, before either program sets its own.
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads"

ratios=""
mfus=""
r=1
while [ "$r" -le "$rounds" ]; do
  echo "== round $r/$rounds: tessera"
  t_out=$("$bench" --threads "$threads" --steps 3)
  echo "$t_out"
  echo "== round $r/$rounds: pytorch eager"
  p_out=$("$python" "$here/pytorch_llama.py" --threads "$threads" --steps 3 --warmup 1)
  echo "$p_out"
  t=$(echo "$t_out" | sed -n 's/^bench_train tokens_per_s=\([0-9.]*\).*/\1/p')
  m=$(echo "$t_out" | sed -n 's/^bench_train .* mfu=\([0-9.]*\).*/\1/p')
  p=$(echo "$p_out" | sed -n 's/^pytorch_llama tokens_per_s=\([0-9.]*\).*/\1/p')
  [ -n "$t" ] && [ -n "$p" ] || { echo "compare_pytorch.sh: a benchmark printed no figure" >&2; exit 1; }
  echo "== round $r/$rounds: ratio"
  awk -v t="$t" -v p="$p" -v m="$m" 'BEGIN { printf "tessera %.1f tokens/s (MFU %.1f%%), pytorch %.1f tokens/s: %.2fx (target >= 2.0x)\n", t, 100 * m, p, t / p }'
  ratios="$ratios $(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.3f", t / p }')"
  mfus="$mfus $m"
  r=$((r + 1))
done
if [ "$rounds" -gt 1 ]; then
  echo "$ratios" | awk '{ lo = hi = $1; for (i = 2; i <= NF; i++) { if ($i < lo) lo = $i; if ($i > hi) hi = $i }
    printf "== %d rounds: tessera/pytorch %.2fx .. %.2fx\n", NF, lo, hi }'
  echo "$mfus" | awk '{ lo = hi = $1; for (i = 2; i <= NF; i++) { if ($i < lo) lo = $i; if ($i > hi) hi = $i }
    printf "== %d rounds: tessera MFU %.1f%% .. %.1f%% of the sgemm peak measured in each run (target >= 75%%)\n", NF, 100 * lo, 100 * hi }'
fi
