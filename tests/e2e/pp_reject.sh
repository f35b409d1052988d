#!/bin/sh
# `tessera plan` of JOB with [strategy.pp] lines replaced; prints its output and exit=STATUS.
# usage: pp_reject.sh TESSERA JOB OUT.ini "key = value|key = value..."
bin=$1 job=$2 out=$3 lines=$4
cp "$job" "$out"
old_ifs=$IFS
IFS='|'
for line in $lines; do
  key=${line%% =*}
  sed -i -e "/^$key = /d" -e "s/^\[strategy.pp\]/[strategy.pp]\n$line/" "$out"
done
IFS=$old_ifs
"$bin" plan "$out" 2>&1
echo "exit=$?"
