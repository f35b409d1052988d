#!/bin/sh
# set_checks.sh TESSERA JOB DIR: --set gets the checks the job file gets, and an overridden key
# is reported as "--set SECTION.KEY", not at the file's old line or at line 0.
set -u
bin=$1 job=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir/cwd"
fails=0
expect() {
  want=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re" ||
    printf '%s\n' "$out" | grep -q '^step '; then
    printf 'FAILED (exit %s, want %s, /%s/): %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}
run() { "$bin" run "$job" --no-peak --no-progress "$@"; }
# 2^30 ranks, and a 7-dim mesh whose product overflows int64: refused before anything is made
expect 2 "--set mesh.shape: the shape's product exceeds 1048576 ranks" \
  run --set mesh.dims=a,b,c --set mesh.shape=1024,1024,1024
expect 2 "--set mesh.shape: the shape's product exceeds 1048576 ranks" \
  run --set mesh.dims=a,b,c,d,e,f,g --set mesh.shape=1024,1024,1024,1024,1024,1024,1024
sed -e "s/^dims .*/dims = a, b, c, d, e, f, g/" -e "s/^shape .*/shape = 1024, 1024, 1024, 1024, 1024, 1024, 1024/" \
  "$job" >"$dir/big.ini"
expect 2 "big.ini:[0-9]*: \[mesh\] shape: the product exceeds 1048576 ranks" "$bin" plan "$dir/big.ini"
# a world size the mesh does not have
expect 2 "--set job.world_size: \[job\] world_size = 3 but \[mesh\] shape's product is 1" \
  run --set job.world_size=3
# an override of a key the file sets is reported as the override
expect 2 "--set optimizer.grad_accum_steps: 3 does not divide" run --set optimizer.grad_accum_steps=3
expect 2 "--set data.source: .*/none.bin: cannot open" run --set data.source=tokens:/none.bin
# plugins.path entries are taken from the current directory, as run --help says
expect 2 "--set plugins.load: nosuch: .*\[$dir/cwd/rel1, /abs2, $dir/cwd/rel3," \
  sh -c "cd '$dir/cwd' && '$bin' run '$job' --no-peak --set plugins.load=nosuch --set plugins.path=rel1:/abs2,rel3"
# plan resolves a relative path of an override from the current directory too, as run does
for cmd in run plan; do
  expect 2 "--set data.source: $dir/cwd/rel.bin: cannot open" \
    sh -c "cd '$dir/cwd' && '$bin' $cmd '$job' --set data.source=tokens:rel.bin"
  expect 2 "--set output.tensorboard: $dir/cwd/no/tb: its parent $dir/cwd/no is not an existing directory" \
    sh -c "cd '$dir/cwd' && '$bin' $cmd '$job' --set output.tensorboard=no/tb"
done
[ "$fails" = 0 ] && echo "set checks: ok"
