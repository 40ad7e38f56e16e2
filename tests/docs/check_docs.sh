#!/usr/bin/env bash
# Docs and manual pages checked against the code, mechanically:
#  1. every key of gpubuf.conf(5) is accepted by gpubufd --check-config and
#     is in operations.md, and every key the daemon's parser knows is in
#     gpubuf.conf(5);
#  2. every error code of gpubuf.h is in client-api.md, protocol.md,
#     libgpubuf-client(3) and named by gpubuf_err_name();
#  3. every option of gpubufctl(1) is in gpubufctl --help and back, and in
#     operations.md; the same for gpubufd(8) and gpubufd --help; every
#     gpubufctl command of --help is in gpubufctl(1);
#  4. the log levels of gpubufd --help are those of gpubufd(8);
#  5. every public function of gpubuf.h is in client-api.md and in
#     libgpubuf-client(3);
#  6. every message of gpubuf.proto is in protocol.md;
#  7. every metric family gpubufctl metrics prints (against a running daemon)
#     is in operations.md and gpubufctl(1), and every metric the Metrics
#     section of operations.md names is printed;
#  8. every exported int function of the library clears and sets the
#     thread's error message, as gpubuf.h promises.
# Usage: check_docs.sh SOURCE_DIR GPUBUFD GPUBUFCTL
set -uo pipefail
src=$1 gpubufd=$2 gpubufctl=$3
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
work=$(mktemp -d /tmp/gpubuf-docs-XXXXXX)
daemon=
cleanup() {
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# --- 1. configuration keys -------------------------------------------------
conf=$src/man/gpubuf.conf.5.scd
# A valid value for each key, by key; a key without one here fails, so that
# a new key gets a check.
declare -A value=(
    [socket]=/tmp/gpubuf-docs.sock [socket_mode]=0660 [socket_group]=root [log_level]=debug
    [max_clients]=16 [max_clients_per_uid]=4 [max_request]=64K [handshake_timeout_ms]=100
    [frame_timeout_ms]=100 [max_buffers_per_client]=10 [max_bytes_per_client]=1G
    [max_buffers_per_uid]=10 [max_bytes_per_uid]=1G [max_refs_per_client]=10
    [max_kept_slabs_per_client]=2 [max_reply_memory]=64M [resume_timeout_ms]=5000 [state_journal]=off
    [max_lease_ms]=60000 [max_meta_bytes_per_client]=1M [max_meta_bytes_per_uid]=4M
    [max_meta_bytes]=64M [max_waiters_per_client]=20000 [poll_us]=100
    [kind]=host [device]=0 [capacity]=64M [slab_size]=16M [slab]=16M
    [allow_users]=root [allow_uids]=0 [allow_groups]=root [allow_gids]=0
    [publish_users]=root [publish_uids]=0 [publish_groups]=root [publish_gids]=0
)
section=
keys=()
while IFS= read -r line; do
    case $line in
    "# SECTION [daemon]"*) section=daemon ;;
    "# SECTION [pool:"*) section=pool ;;
    "# "*) section= ;;
    esac
    [ -n "$section" ] || continue
    # "*key* = _value_" at the start of an entry, and its alias "(or *alias*"
    for k in $(printf '%s\n' "$line" | grep -E '^\*[a-z_]+\* =' |
        grep -oE '^\*[a-z_]+\* =|\(or \*[a-z_]+\*' | sed -E 's/^\(or //; s/^\*//; s/\*( =)?$//'); do
        keys+=("$section:$k")
    done
done <"$conf"
[ "${#keys[@]}" -ge 20 ] || fail "found only ${#keys[@]} keys in gpubuf.conf(5)"
for sk in "${keys[@]}"; do
    s=${sk%%:*} k=${sk#*:}
    v=${value[$k]:-}
    if [ -z "$v" ]; then
        fail "gpubuf.conf(5) key '$k' has no test value in $0"
        continue
    fi
    if [ "$s" = daemon ]; then
        printf '[daemon]\n%s = %s\n' "$k" "$v" >"$work/c.conf"
    else
        printf '[pool:p]\nkind = host\n%s = %s\n' "$k" "$v" >"$work/c.conf"
    fi
    out=$("$gpubufd" --check-config --config "$work/c.conf" 2>&1) ||
        fail "gpubufd --check-config rejects '$k = $v' of [$s]: $out"
done
# operations.md has the same keys.
for sk in "${keys[@]}"; do
    grep -q "\`${sk#*:}\`" "$src/docs/operations.md" ||
        fail "gpubuf.conf(5) key '${sk#*:}' is not in operations.md"
done
# Every key the daemon's parser knows is documented: the entries of its key
# tables ({"key", "alias" or NULL, parse_...}) or the keys it compares with.
parsed=$(cat "$src"/daemon/*.c |
    grep -oE '\{"[a-z_]+", ("[a-z_]+"|NULL), parse_|strcmp\(key, "[a-z_]+"\)' |
    grep -oE '"[a-z_]+"' | tr -d '"' | sort -u)
[ "$(wc -w <<<"$parsed")" -ge 20 ] || fail "found only these keys in the daemon's parser: $parsed"
for k in $parsed; do
    grep -qE "^\*$k\* =|\(or \*$k\*" "$conf" || fail "config key '$k' (daemon/) is not in gpubuf.conf(5)"
done
# An unknown key is refused, naming it.
printf '[daemon]\nno_such_key = 1\n' >"$work/c.conf"
out=$("$gpubufd" --check-config --config "$work/c.conf" 2>&1) &&
    fail "gpubufd --check-config accepts an unknown key"
case $out in *no_such_key*) ;; *) fail "the unknown-key error does not name the key: $out" ;; esac

# --- 2. error codes ---------------------------------------------------------
codes=$(grep -oE '^\s+GPUBUF_E[A-Z]+ = -[0-9]+' "$src/include/gpubuf/gpubuf.h" | awk '{print $1}')
[ -n "$codes" ] || fail "no error codes found in gpubuf.h"
for code in $codes; do
    for doc in docs/client-api.md docs/protocol.md man/libgpubuf-client.3.scd; do
        grep -q "$code" "$src/$doc" || fail "$code (gpubuf.h) is not in $doc"
    done
    grep -q "case $code: return \"$code\"" "$src/common/errors.c" ||
        fail "gpubuf_err_name() does not name $code"
done

# --- 3. options and commands ------------------------------------------------
# Long options of a man page's OPTIONS section: lines "*-x*, *--long*" or "*--long*".
man_options() {
    sed -n '/^# OPTIONS/,/^# [A-Z]/p' "$1" | grep -oE '^\*(-[a-zA-Z]\*, \*)?--[a-z-]+' |
        grep -oE -- '--[a-z-]+' | sort -u
}
help_options() { "$1" --help | grep -oE -- '^ +(-[a-zA-Z], )?--[a-z-]+' | grep -oE -- '--[a-z-]+' | sort -u; }
for tool in gpubufctl:man/gpubufctl.1.scd gpubufd:man/gpubufd.8.scd; do
    name=${tool%%:*} page=$src/${tool#*:}
    bin=$gpubufctl
    [ "$name" = gpubufd ] && bin=$gpubufd
    m=$(man_options "$page") h=$(help_options "$bin")
    [ -n "$m" ] && [ -n "$h" ] || fail "no options found for $name (man: $m; help: $h)"
    for o in $m; do grep -qx -- "$o" <<<"$h" || fail "$name: $o is in its man page but not in --help"; done
    for o in $h; do
        grep -qx -- "$o" <<<"$m" || fail "$name: $o is in --help but not in its man page"
        grep -q -- "\`$o\b" "$src/docs/operations.md" || fail "$name: $o is not in operations.md"
    done
    # Short options: "*-x*, *--long*" in the man page, "-x, --long" in --help.
    ms=$(grep -oE '^\*-[a-zA-Z]\*, \*--[a-z-]+' "$page" | sed -E 's/^\*(-.)\*, \*(--.*)/\1 \2/' | sort -u)
    hs=$("$bin" --help | grep -oE '^ +-[a-zA-Z], --[a-z-]+' | sed -E 's/^ +(-.), (--.*)/\1 \2/' | sort -u)
    [ "$ms" = "$hs" ] || fail "$name: short options differ: man [$ms] help [$hs]"
done
cmds=$("$gpubufctl" --help | sed -n '/^Commands:/,/^$/p' | grep -oE '^  [a-z]+' | tr -d ' ')
[ "$(wc -w <<<"$cmds")" -ge 6 ] || fail "gpubufctl --help lists only: $cmds"
for c in $cmds; do
    sed -n '/^# COMMANDS/,/^# [A-Z]/p' "$src/man/gpubufctl.1.scd" | grep -qE "^\*$c\*" ||
        fail "gpubufctl command '$c' (--help) is not in gpubufctl(1) COMMANDS"
done

# --- 4. log levels ----------------------------------------------------------
levels() { grep -oE 'emerg|alert|crit|err|warning|notice|info|debug' | sort -u | tr '\n' ' '; }
hl=$("$gpubufd" --help | grep -A1 -- '--log-level' | levels)
ml=$(sed -n '/^\*-l\*, \*--log-level\*/,/^$/p' "$src/man/gpubufd.8.scd" | levels)
[ "$hl" = "$ml" ] || fail "log levels: gpubufd --help [$hl] vs gpubufd(8) [$ml]"

# --- 5. public functions ----------------------------------------------------
for f in $(grep -oE '^GPUBUF_EXTERN [^(]*\bgpubuf_[a-z_]+\(' "$src/include/gpubuf/gpubuf.h" |
    grep -oE 'gpubuf_[a-z_]+\($' | tr -d '('); do
    grep -qE "\b$f\b" "$src/docs/client-api.md" || fail "$f is not in client-api.md"
    grep -q "$f" "$src/man/libgpubuf-client.3.scd" || fail "$f is not in libgpubuf-client(3)"
done

# --- 6. protocol messages ---------------------------------------------------
for m in $(grep -oE '^message [A-Za-z]+' "$src/proto/gpubuf.proto" | awk '{print $2}'); do
    grep -q "\b$m\b" "$src/docs/protocol.md" || fail "message $m (gpubuf.proto) is not in protocol.md"
done

# --- 7. metric families -----------------------------------------------------
sock=$work/d.sock
"$gpubufd" --socket "$sock" --pool docs=host,capacity=16M --log-level err &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
if out=$("$gpubufctl" --socket "$sock" metrics); then
    fams=$(grep -oE '^# TYPE [a-z_]+' <<<"$out" | awk '{print $3}')
    [ "$(wc -w <<<"$fams")" -ge 20 ] || fail "gpubufctl metrics printed only: $fams"
    for f in $fams; do
        grep -q "$f" "$src/docs/operations.md" || fail "metric $f is not in operations.md"
        grep -q "$f" "$src/man/gpubufctl.1.scd" || fail "metric $f is not in gpubufctl(1)"
    done
    # And back: every metric the Metrics section of operations.md names is printed.
    for f in $(sed -n '/^### Metrics/,/^## /p' "$src/docs/operations.md" |
        grep -oE '\bgpubuf_[a-z_]+' | sort -u); do
        base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$f")
        grep -qx "$f" <<<"$fams" || grep -qx "$base" <<<"$fams" ||
            fail "operations.md names metric $f, which gpubufctl metrics does not print"
    done
else
    fail "gpubufctl metrics failed against a fresh daemon"
fi

# --- 8. the library's error messages ---------------------------------------
# gpubuf.h promises that gpubuf_last_error_message() belongs to the thread's
# last call that returns an error code: every exported int function of the
# library clears it first (accessors that return no error code aside).
accessors="gpubuf_buffer_read_only gpubuf_buffer_device gpubuf_buffer_memory_device"
for f in $(cat "$src"/client/*.c | grep -oE '^GPUBUF_EXTERN int gpubuf_[a-z_]+\(' |
    grep -oE 'gpubuf_[a-z_]+' | sort -u); do
    grep -qw "$f" <<<"$accessors" && continue
    # A deprecated name that is an alias of its new one (GPUBUF_ALIAS) has its body.
    cat "$src"/client/*.c | sed -n "/^GPUBUF_EXTERN int $f(/,/[;{]\$/p" | grep -q 'GPUBUF_ALIAS(' &&
        continue
    body=$(cat "$src"/client/*.c | sed -n "/^GPUBUF_EXTERN int $f(/,/^}/p")
    grep -q 'gpubuf__clear_error();' <<<"$body" && grep -q 'gpubuf__result(' <<<"$body" ||
        fail "$f does not clear and set the thread's error message (gpubuf__clear_error, gpubuf__result)"
done

if [ "$fails" -gt 0 ]; then
    echo "$fails documentation check(s) failed"
    exit 1
fi
echo "documentation checks: ok (${#keys[@]} configuration keys, $(wc -w <<<"$codes") error codes)"
