#!/usr/bin/env bash
# Every function the public header declares (GPUBUF_EXTERN) is exported by
# libgpubuf-client.so, and the library exports nothing else.
#   check_exports.sh HEADER LIBRARY
set -euo pipefail
header=$1 lib=$2
want=$(grep -v '#define' "$header" | tr '\n' ' ' | grep -oE 'GPUBUF_EXTERN[^;{]*\(' |
    grep -oE '[a-z_0-9]+ *\($' | tr -d ' (' | sort -u)
have=$(nm -D --defined-only "$lib" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort -u)
missing=$(comm -23 <(echo "$want") <(echo "$have"))
extra=$(comm -13 <(echo "$want") <(echo "$have"))
[ -n "$want" ] || { echo "no GPUBUF_EXTERN declarations found in $header"; exit 1; }
if [ -n "$missing$extra" ]; then
    [ -n "$missing" ] && echo "declared but not exported:" $missing
    [ -n "$extra" ] && echo "exported but not declared:" $extra
    exit 1
fi
echo "$(echo "$want" | wc -l) public functions, all exported, nothing else"
