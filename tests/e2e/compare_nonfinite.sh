#!/bin/sh
# compare_nonfinite.sh TESSERA DIR: `tessera compare` and non-finite values. A NaN or an
# infinity agrees only with the same value at the same place, elementwise and under --rel-l2;
# an Inf in the reference does not make the tolerance infinite.
set -u
bin=$1 dir=$2
rm -rf "$dir"
mkdir -p "$dir"
# st NAME V1 V2 V3 V4: a file with one F32 tensor "t" of four values given as octal byte quads
st() {
  f="$dir/$1.safetensors"
  shift
  hdr='{"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
  while [ $((${#hdr} % 8)) != 0 ]; do hdr="$hdr "; done
  printf "\\$(printf %03o ${#hdr})\\000\\000\\000\\000\\000\\000\\000" >"$f"
  printf '%s' "$hdr" >>"$f"
  for v in "$@"; do printf "$v" >>"$f"; done
}
one='\000\000\200\077' two='\000\000\000\100' inf='\000\000\200\177' ninf='\000\000\200\377'
nan='\000\000\300\177'
st ref "$one" "$inf" "$two" "$one"
st ref_nan "$one" "$nan" "$two" "$one"
st finite "$one" "$two" "$two" "$one"
st same_inf "$one" "$inf" "$two" "$one"
st neg_inf "$one" "$ninf" "$two" "$one"
st nan "$one" "$nan" "$two" "$one"
st moved_nan "$nan" "$two" "$two" "$one"
fails=0
# check WANT_EXIT REGEX ARGS...
check() {
  want=$1 re=$2
  shift 2
  out=$("$bin" compare "$@" 2>&1)
  code=$?
  if [ "$code" != "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$re"; then
    printf 'FAILED (exit %s, want %s, /%s/): compare %s\n%s\n' "$code" "$want" "$re" "$*" "$out"
    fails=$((fails + 1))
  fi
}
r() { echo "$dir/$1.safetensors"; }
# elementwise
check 1 "DIFFER: 1 tensor" "$(r finite)" "$(r ref)"
check 1 "DIFFER: 1 tensor" "$(r neg_inf)" "$(r ref)"
check 1 "DIFFER: 1 tensor" "$(r nan)" "$(r ref)"
check 0 "MATCH: 0 tensors" "$(r same_inf)" "$(r ref)"
check 0 "MATCH: 0 tensors" "$(r nan)" "$(r ref_nan)"
check 1 "DIFFER: 1 tensor" "$(r moved_nan)" "$(r ref_nan)"
check 1 "t: 1 of 4 elements differ; worst at \[1\]: 2 vs inf" "$(r finite)" "$(r ref)"
# relative L2
check 1 "t: 1 non-finite element not matched; first at index 1: 2 vs inf" "$(r finite)" "$(r ref)" --rel-l2 0.1
check 1 "DIFFER: 1 tensor" "$(r nan)" "$(r finite)" --rel-l2 0.1
check 1 "DIFFER: 1 tensor" "$(r moved_nan)" "$(r ref_nan)" --rel-l2 0.1
check 0 "MATCH: 0 tensors" "$(r nan)" "$(r ref_nan)" --rel-l2 0.1
check 0 "MATCH: 0 tensors" "$(r same_inf)" "$(r ref)" --rel-l2 0.1
[ "$fails" = 0 ] && echo "compare nonfinite: ok"
