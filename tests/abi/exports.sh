#!/usr/bin/env bash
# exports.sh LIBTESSERA HEADER_DIR [NM]: the dynamic symbols LIBTESSERA defines (functions and
# data, `nm -D --defined-only`) are exactly the names that HEADER_DIR/*.h declare with TSR_API.
# On a mismatch it lists the names exported but not declared (an internal function leaking out,
# or a declaration that lost its mark) and those declared but not exported (a declaration
# without a definition, or a definition that is static or hidden), and fails.
set -euo pipefail
lib=$1 headers=$2 nm=${3:-nm}

# Names a declaration that starts with TSR_API introduces: the last identifier before the first
# '(' (functions), '[' or ';' (data), reading on across lines until one of them appears.
declared() {
  awk '
    function flush(decl,   n, i, w) {
      sub(/[(;[].*/, "", decl)
      n = split(decl, w, /[^A-Za-z0-9_]+/)
      for (i = n; i > 0; i--) if (w[i] != "") { print w[i]; return }
    }
    open { decl = decl " " $0; if (decl ~ /[(;[]/) { flush(decl); open = 0 } next }
    /^[ \t]*TSR_API[ \t]/ { decl = $0; if (decl ~ /[(;[]/) flush(decl); else open = 1 }
  ' "$headers"/*.h
}

exported() {
  "$nm" -D --defined-only "$lib" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }'
}

decl_out=$(declared) || { echo "abi_exports: cannot read $headers/*.h"; exit 1; }
exp_out=$(exported) || { echo "abi_exports: $nm cannot read $lib"; exit 1; }

awk -v decl="$decl_out" -v exported="$exp_out" -v lib="$lib" -v headers="$headers" '
  BEGIN {
    nd = split(decl, d, "\n"); ne = split(exported, e, "\n")
    for (i = 1; i <= nd; i++) if (d[i] != "" && !(d[i] in isdecl)) { isdecl[d[i]] = 1; ndecl++ }
    for (i = 1; i <= ne; i++) if (e[i] != "" && !(e[i] in isexp)) { isexp[e[i]] = 1; nexp++ }
    if (ndecl == 0) { print "abi_exports: no TSR_API declaration in " headers "/*.h"; exit 1 }
    if (nexp == 0) { print "abi_exports: " lib " exports nothing"; exit 1 }
    for (i = 1; i <= ne; i++)
      if (e[i] != "" && !(e[i] in isdecl) && !(e[i] in shown)) { shown[e[i]] = 1; extra[++nx] = e[i] }
    for (i = 1; i <= nd; i++)
      if (d[i] != "" && !(d[i] in isexp) && !(d[i] in shown)) { shown[d[i]] = 1; missing[++nmiss] = d[i] }
    printf "%s exports %d symbols; %s/*.h declare %d names with TSR_API\n", lib, nexp, headers, ndecl
    if (nx) {
      printf "exported but not declared with TSR_API (%d):\n", nx
      for (i = 1; i <= nx; i++) print "  " extra[i]
    }
    if (nmiss) {
      printf "declared with TSR_API but not exported (%d):\n", nmiss
      for (i = 1; i <= nmiss; i++) print "  " missing[i]
    }
    if (nx || nmiss) { print "FAIL: the exported symbols differ from the TSR_API declarations"; exit 1 }
    print "ok: the exported symbols are exactly the TSR_API declarations"
  }'
