#!/usr/bin/env bash
# Clients in namespaces of their own, as a container runtime makes them: a
# user namespace (root inside, mapped to a uid outside), a PID namespace with
# its own /proc, a mount namespace that sees gpubufd's socket directory only
# through a bind mount, a network and an IPC namespace. They connect, alloc,
# seal and open, crash (SIGKILL: references go back), keep their views over a
# takeover (the session resumes), and the daemon sees them with the pid and
# uid of its own namespaces (SO_PEERCRED). Also: a daemon in a user namespace
# sees unmapped peers as the overflow uid, and what that means for access
# lists and owners; a process in a new PID namespace with its parent's /proc
# is told so (docs/containers.md, docs/security.md "Namespaces").
#
#   namespaces.sh GPUBUFD GPUBUFCTL NS_CLIENT CONSUMER PRODUCER [host|gpu]
#
# host: host pools (CI). gpu: cuda-ipc and cuda-vmm pools, buffers checked on
# the device (exit 77 without a GPU). Exit 77 where unshare is forbidden.
set -euo pipefail
gpubufd=$1 ctl=$2 nsclient_built=$3 consumer=$4 producer=$5 mode=${6:-host}
skip() { echo "namespaces: SKIP: $*"; exit 77; }
fail() { echo "namespaces: FAIL: $*" >&2; exit 1; }
say() { echo "-- $*"; }

command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
if ! err=$(unshare --user --map-root-user --pid --fork --mount-proc --mount --net --ipc \
    true 2>&1); then
    skip "this machine forbids new user, PID, mount, network or IPC namespaces ($err)"
fi
if [ "$mode" = gpu ] && [ ! -e /dev/nvidiactl ]; then
    skip "no NVIDIA device (/dev/nvidiactl)"
fi

work=$(mktemp -d /tmp/gpubuf-ns-XXXXXX)
chmod 755 "$work"
daemons=()
declare -A CW CR CP
cleanup() {
    local p
    for p in "${CP[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${daemons[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
# The client runs as other uids too: a copy they can execute.
nsclient=$work/ns_client
cp "$nsclient_built" "$nsclient"
chmod 755 "$nsclient"

# A daemon: start_daemon VAR SOCKET [PREFIX...] -- ARGS...
start_daemon() {
    local var=$1 sock=$2 pre=()
    shift 2
    while [ "$1" != -- ]; do pre+=("$1"); shift; done
    shift
    mkdir -p "$(dirname "$sock")"
    chmod 755 "$(dirname "$sock")"
    "${pre[@]}" "$gpubufd" --socket "$sock" --log-level warning "$@" 2>>"$work/daemon.log" &
    local pid=$!
    daemons+=("$pid")
    printf -v "$var" %s "$pid"
    wait_ctl "$sock" || { cat "$work/daemon.log"; fail "gpubufd did not serve on $sock"; }
    chmod 666 "$sock"
}
# Poll until gpubufctl is answered (a condition, never a fixed time).
wait_ctl() {
    for _ in $(seq 2000); do
        "$ctl" --socket "$1" pools >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    return 1
}
# A client: client ID [PREFIX...] -- SOCKET. PREFIX: setpriv, unshare...
client() {
    local id=$1 pre=() w r
    shift
    while [ "$1" != -- ]; do pre+=("$1"); shift; done
    mkfifo -m 666 "$work/$id.in" "$work/$id.out"
    "${pre[@]}" "$nsclient" "$2" <"$work/$id.in" >"$work/$id.out" 2>"$work/$id.err" &
    CP[$id]=$!
    exec {w}>"$work/$id.in"
    exec {r}<"$work/$id.out"
    CW[$id]=$w
    CR[$id]=$r
}
# ask ID COMMAND...: the one-line answer in $REPLY.
ask() {
    local id=$1
    shift
    echo "$*" >&"${CW[$id]}"
    IFS= read -r -t 600 -u "${CR[$id]}" REPLY ||
        fail "client $id did not answer '$*' (stderr: $(cat "$work/$id.err"))"
}
expect() { # expect ID PATTERN COMMAND...
    local id=$1 pat=$2
    shift 2
    ask "$id" "$@"
    # shellcheck disable=SC2053
    [[ $REPLY == $pat ]] || fail "client $id: '$*' answered '$REPLY', expected '$pat'"
}
# The outside pid of the process unshare forked, pid 1 of its PID namespace
# (unshare may fork a helper that writes the uid map first: not that one).
inner_pid() {
    local p=$1 c ns
    for _ in $(seq 2000); do
        for c in $(cat "/proc/$p/task/$p/children" 2>/dev/null || true); do
            ns=$(sed -n 's/^NSpid:[[:space:]]*//p' "/proc/$c/status" 2>/dev/null || true)
            [[ $ns == *[[:space:]]1 ]] && { echo "$c"; return; }
        done
        sleep 0.01
    done
    fail "no pid 1 of a new PID namespace below pid $p"
}
# clients_json SOCKET: what gpubufd says of its clients, "pid uid" a line.
seen() {
    "$ctl" --socket "$1" --json clients | python3 -c '
import json, sys
for c in json.load(sys.stdin)["clients"]:
    print(c["pid"], c["uid"], "detached" if c.get("detached") else "attached")'
}
# wait_seen SOCKET REGEX: until a line of seen matches (a client's entry may
# show a moment after its first reply, on a loaded machine).
wait_seen() {
    for _ in $(seq 2000); do
        seen "$1" | grep -qE "$2" && return 0
        sleep 0.05
    done
    return 1
}
refs() {
    "$ctl" --socket "$1" --json buffers | python3 -c '
import json, sys
print(sum(b["refs"] for b in json.load(sys.stdin)["buffers"] if b["name"] == sys.argv[1]))' "$2"
}
wait_refs() { # wait_refs SOCKET NAME N
    for _ in $(seq 4000); do
        [ "$(refs "$1" "$2")" = "$3" ] && return 0
        sleep 0.05
    done
    fail "buffer $2 kept $(refs "$1" "$2") references, expected $3"
}

# The container: its own user (root inside = our uid outside), PID (with its
# own /proc), mount, network and IPC namespaces; gpubufd's socket directory is
# bind-mounted at $ctr/run/gpubuf and the original hidden under a tmpfs.
sockdir=$work/run
sock=$sockdir/gpubufd.sock
ctr=$work/ctr
mkdir -p "$ctr/run/gpubuf"
csock=$ctr/run/gpubuf/gpubufd.sock
container=(unshare --user --map-root-user --pid --fork --mount-proc --mount --net --ipc
           sh -c 'mount --bind "$1" "$2" && mount -t tmpfs none "$1" && shift 2 && exec "$@"'
           sh "$sockdir" "$ctr/run/gpubuf")

if [ "$mode" = host ]; then
    pools=(--pool host=host,capacity=64M)
    kinds=(host)
else
    pools=(--pool ipc=cuda-ipc,device=0,capacity=1G --pool vmm=cuda-vmm,device=0,capacity=1G)
    kinds=(ipc vmm)
fi
start_daemon d1 "$sock" -- "${pools[@]}"

say "a client in its own user, PID, mount, network and IPC namespaces"
client c1 "${container[@]}" -- "$csock"
expect c1 "hello pid 1 self 1 uid 0 gid 0" hello
expect c1 "proc own" proc
c1_out=$(inner_pid "${CP[c1]}")
ask c1 stat nothing-here   # connects
echo "   $REPLY"
wait_seen "$sock" "^$c1_out $(id -u) attached$" ||
    fail "gpubufd does not see pid $c1_out uid $(id -u): $(seen "$sock")"
echo "   gpubufd sees the container's pid 1 as pid $c1_out, its uid 0 as uid $(id -u)"

for k in "${kinds[@]}"; do
    say "[$k] alloc and seal inside, open outside; and the other way"
    expect c1 "sealed *" alloc "$k" "ns/$k/in" 4194304 7
    out=$("$consumer" --socket "$sock" --name "/$k/ns/$k/in" --seed 7) ||
        fail "outside consumer: $out"
    case $out in *" 0 mismatches"*) echo "   outside: $out" ;; *) fail "outside: $out" ;; esac
    "$producer" --socket "$sock" --pool "$k" --name "ns/$k/out" --size 4M --seed 9 >/dev/null
    expect c1 "opened * 0 on *" open "/$k/ns/$k/out" 9
    echo "   inside: $REPLY"
    [ "$(refs "$sock" "ns/$k/out")" = 1 ] || fail "the container's open is not counted"

    say "[$k] a client killed in its namespace: its references go back"
    client crash "${container[@]}" -- "$csock"
    expect crash "opened * 0 on *" open "/$k/ns/$k/in" 7
    wait_refs "$sock" "ns/$k/in" 1
    kill -KILL "$(inner_pid "${CP[crash]}")"   # the container's pid 1: all of it goes
    wait "${CP[crash]}" 2>/dev/null || true
    unset "CP[crash]"
    wait_refs "$sock" "ns/$k/in" 0
    rm -f "$work/crash.in" "$work/crash.out"
    echo "   references of ns/$k/in: 1 -> 0"
done

if [ "$mode" = host ] || printf '%s\n' "${kinds[@]}" | grep -qx vmm; then
    k=${kinds[-1]}
    say "[$k] gpubufd taken over: the container's session resumes, its view still reads"
    expect c1 "released *" release
    # cuda-ipc memory dies with the daemon that made it: those buffers go first.
    for g in "${kinds[@]}"; do
        [ "$g" = "$k" ] && continue
        "$ctl" --socket "$sock" delete "/$g/ns/$g/in" "/$g/ns/$g/out" >/dev/null
    done
    expect c1 "opened * 0 on *" open "/$k/ns/$k/in" 7
    "$gpubufd" --socket "$sock" --log-level warning "${pools[@]}" --takeover \
        2>>"$work/daemon.log" &
    d2=$!
    daemons+=("$d2")
    # The old gpubufd exits 0 once the successor serves. A takeover that fails
    # leaves the old one serving and the successor gone: fail then, rather than
    # wait for an exit that does not come.
    st=0
    wait -n -p done_pid "$d1" "$d2" || st=$?
    [ "$done_pid" = "$d1" ] ||
        fail "the takeover failed: the successor exited $st ($(cat "$work/daemon.log"))"
    [ "$st" = 0 ] || fail "the old gpubufd exited $st at the takeover ($(cat "$work/daemon.log"))"
    expect c1 "stat refs 1 owner *" stat "/$k/ns/$k/in"
    expect c1 "checked 0" check 7
    wait_seen "$sock" "^$c1_out $(id -u) attached$" ||
        fail "the session did not resume: $(seen "$sock")"
    echo "   after the takeover: $REPLY; the session of pid $c1_out resumed"
    d1=$d2
fi

if [ "$mode" = gpu ]; then
    say "a new PID namespace with its parent's /proc: the library says what is wrong"
    client badproc unshare --pid --fork -- "$sock"
    ask badproc open "/${kinds[-1]}/ns/${kinds[-1]}/in" 7
    case $REPLY in
    *"/proc is another PID namespace's"*"--mount-proc"*) echo "   $REPLY" ;;
    opened*) echo "   note: the driver worked with the parent's /proc here: $REPLY" ;;
    *) fail "open with the parent's /proc answered: $REPLY" ;;
    esac
    echo "namespaces: ok ($mode)"
    exit 0
fi

say "a new PID namespace with its parent's /proc is detected"
client pp unshare --user --map-root-user --pid --fork -- "$sock"
expect pp "proc foreign: /proc is another PID namespace's: /proc/self is pid * but this process is pid 1 *--mount-proc*" proc
echo "   $REPLY"

# Other uids: unprivileged user namespaces must be allowed for them.
uid_a=61234 uid_b=61235
if ! err=$(setpriv --reuid=$uid_a --regid=$uid_a --clear-groups \
    unshare --user --map-root-user true 2>&1); then
    echo "   (uid $uid_a cannot make a user namespace here: $err; uid cases skipped)"
    echo "namespaces: ok ($mode; uid cases skipped)"
    exit 0
fi
as_a=(setpriv --reuid=$uid_a --regid=$uid_a --clear-groups)
as_b=(setpriv --reuid=$uid_b --regid=$uid_b --clear-groups)

say "root inside a user namespace is its uid outside to gpubufd"
"$ctl" --socket "$sock" pools >/dev/null
start_daemon d3 "$work/acl/gpubufd.sock" -- --pool host=host,capacity=16M \
    --pool "mine=host,capacity=8M,allow_uids=$uid_a" --pool "theirs=host,capacity=8M,allow_uids=4321"
client r "${as_a[@]}" unshare --user --map-root-user --pid --fork --mount-proc -- \
    "$work/acl/gpubufd.sock"
expect r "hello pid 1 self 1 uid 0 gid 0" hello
expect r "sealed *" alloc mine r/1 4096 1
expect r "error -13 *" alloc theirs r/2 4096 1
echo "   root inside, uid $uid_a outside: pool allowed to $uid_a yes, pool of uid 4321: $REPLY"
wait_seen "$work/acl/gpubufd.sock" "^$(inner_pid "${CP[r]}") $uid_a attached$" ||
    fail "gpubufd does not see uid $uid_a: $(seen "$work/acl/gpubufd.sock")"

say "gpubufd in a user namespace: unmapped peers are the overflow uid"
over=$(cat /proc/sys/kernel/overflowuid)
usock=$work/userns/gpubufd.sock
start_daemon d4 "$usock" unshare --user --map-root-user -- --pool host=host,capacity=16M \
    --pool "nobody=host,capacity=8M,allow_uids=$over" --pool "a=host,capacity=8M,allow_uids=$uid_a"
client ua "${as_a[@]}" -- "$usock"
client ub "${as_b[@]}" -- "$usock"
expect ua "sealed *" alloc host u/a 4096 3
expect ub "stat refs 0 owner $over" stat u/a
wait_seen "$usock" "^[0-9]+ $over attached$" || fail "no overflow uid: $(seen "$usock"; cat "$work/ua.err" "$work/ub.err" "$work/daemon.log")"
expect ua "sealed *" alloc nobody u/n 4096 3
expect ua "error -13 *" alloc a u/x 4096 3
echo "   uid $uid_a seen as $over: pool allowed to $over yes, pool allowed to $uid_a: $REPLY"
expect ub "error -1 *overflow uid*only the session that made it or root*" delete u/a
echo "   another unmapped peer deletes u/a: $REPLY"
expect ub "opened * 0 on host" open u/a 3
expect ua "deleted" delete u/a
"$ctl" --socket "$usock" delete /nobody/u/n >/dev/null || fail "root could not delete u/n"
echo "   the session that made u/a deletes it; root deletes u/n"
echo "namespaces: ok ($mode)"
