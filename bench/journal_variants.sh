#!/usr/bin/env bash
# Where the journal's time goes under 16 processes batching, by taking its
# parts out one at a time: a diagnostic, not a benchmark of the product.
#
#   bench/journal_variants.sh [--host] [--order "0 1 2 3 0 1"] [--out DIR] [--src TAR]
#
# Builds gpubufd once for each variant in --order from the committed tree
# (git archive HEAD; --src: from that tar of a tree instead), each a copy
# with one change that only a measurement may make:
#   0  as committed
#   1  the group copied into the memfd with memcpy (cached stores), not with
#      non-temporal ones (state_write.c, slot_copy)
#   2  no checksum: every frame's is 0 (state_record.c, gd_se_checksum; such a
#      state does not restore)
#   3  no copy into the memfd: the group is staged and checksummed, and only
#      its 8-byte end mark is written (state_write.c, gd_slot_put; such a
#      state does not restore)
#   4  non-temporal stores without the sfence after them (slot_copy)
#   5  cached stores (as 1), and after each group the lines the next group of
#      the same size will take prefetched for writing (gd_slot_put)
#   6  a snapshot only once the journal has grown past 32 MiB, not 4 MiB
#      (STATE_MIN_COMPACT): fewer snapshots
#   7  a snapshot once the journal has grown past 256 KiB (or twice the
#      last snapshot): a journal region small enough to stay in the cache
#   8  the same past 1 MiB
#   9  no buffer entries: a buffer's alloc, seal or change stages nothing
#      (state.c, pend_write; such a state does not restore): what the
#      buffers' entries cost, the bound of any cheaper way to write them
#  10  no reference entries: the registry appends none and the hook writes
#      none (state.c; such a state does not restore): the same for
#      references
#  11  the journal never on: switching it "on" writes the whole snapshot as
#      it does, but leaves the registry's hooks off (state.c,
#      gd_state_switch): both sides run the same code, the pair's own
#      spread and bias (an A/A pair)
#  12  the hooks on, but nothing staged: every entry is refused as with the
#      journal off (state.c, stage_room) and the registry appends none: what
#      the hooks' calls and their bookkeeping cost
# then, for each variant in --order, starts that daemon with
# state_journal = switchable and runs the batchmix phase's journal pair in
# slices (bench/pairs.c: 16 s, the journal off and on every 0.5 s) and
# prints the medians of its rounds and their ratio, and the daemon's own
# account of its journal at the stop (groups, snapshots and their time). gpubufd is pinned to the
# last CPU and the 16 processes to the others, as bench/run.sh pins its
# pairs. A variant whose ratio falls far below the committed one's says that
# part costs the wall time; compare ratios of one call only (the machine's
# speed moves between calls: docs/performance.md, "Where the journal's wall
# time goes").
set -euo pipefail
cd "$(dirname "$0")/.."
kind=cuda-ipc
order="0 1 2 3 0 1"
out=${TMPDIR:-/tmp}/gpubuf-journal-variants
src=""
while [ $# -gt 0 ]; do
    case $1 in
    --host) kind=host ;;
    --order) order=$2; shift ;;
    --out) out=$2; shift ;;
    --src) src=$(realpath "$2"); shift ;;
    *) echo "usage: bench/journal_variants.sh [--host] [--order \"0 1 2 3 4 5 6 7 8 ...\"] [--out DIR] [--src TAR]" >&2; exit 2 ;;
    esac
    shift
done
# A --src tar inside --out (a previous run's src.tar) is taken aside first:
# --out is emptied.
tmp_src=""
if [ -n "$src" ]; then
    tmp_src=$(mktemp)
    cp "$src" "$tmp_src"
fi
rm -rf "$out"
mkdir -p "$out"
if [ -n "$tmp_src" ]; then mv "$tmp_src" "$out/src.tar"; else git archive HEAD -o "$out/src.tar"; fi
# Replace the one line OLD of FILE in variant V's tree by NEW (sed's
# replacement syntax); a line no longer found (the code moved) stops the
# script: every variant must differ from the committed tree where it says.
subst() {
    local v=$1 f=$2 old=$3 new=$4
    cp "$out/src$v/$f" "$out/before"
    sed -i "s/$(printf '%s' "$old" | sed 's/[][\/.*^$]/\\&/g')/$new/" "$out/src$v/$f"
    if cmp -s "$out/src$v/$f" "$out/before"; then
        echo "bench/journal_variants.sh: variant $v: no line of $f changed; update this script" >&2
        exit 1
    fi
}
variants=$(printf '%s\n' $order | sort -u)
for v in $variants; do
    mkdir -p "$out/src$v"
    tar -xf "$out/src.tar" -C "$out/src$v"
    sw=daemon/state_write.c
    case $v in
    0) ;;
    1) subst 1 $sw '    if (len >= 256) {' '    if (0 \&\& len >= 256) {' ;;
    2) subst 2 daemon/state_record.c '    uint64_t seed = gen ^ ((uint64_t)n << 40);' \
           '    if (n) return 0;\n    uint64_t seed = gen ^ ((uint64_t)n << 40);' ;;
    3) subst 3 $sw '        slot_copy(s->map + off, p, len);' '        (void)p;' ;;
    4) subst 4 $sw '        _mm_sfence();' '' ;;
    5) subst 5 $sw '    if (len >= 256) {' '    if (0 \&\& len >= 256) {'
       subst 5 $sw '        memset(s->map + off + len, 0, sizeof(end));' \
           '        memset(s->map + off + len, 0, sizeof(end));\n        for (size_t i = 64; i < len \&\& off + len + i < s->cap; i += 64) __builtin_prefetch(s->map + off + len + i, 1, 3);' ;;
    6) subst 6 daemon/saved_state.h '#define STATE_MIN_COMPACT (4ull << 20)' '#define STATE_MIN_COMPACT (32ull << 20)' ;;
    7) subst 7 daemon/saved_state.h '#define STATE_MIN_COMPACT (4ull << 20)' '#define STATE_MIN_COMPACT (256ull << 10)' ;;
    8) subst 8 daemon/saved_state.h '#define STATE_MIN_COMPACT (4ull << 20)' '#define STATE_MIN_COMPACT (1ull << 20)' ;;
    9) subst 9 daemon/state.c '    gd_se_buffer(&st->stage, b, owner_ref ? ref : NULL);' \
           '    (void)b; (void)ref; (void)owner_ref;' ;;
    10) subst 10 daemon/state.c '        reg->ref_sink = &st->stage;' '        reg->ref_sink = NULL;'
        subst 10 daemon/state.c '    if (!stage_room(st, GD_SE_RUN_HEAD + GD_SE_RUN_ITEM))' \
            '    if (1 || !stage_room(st, GD_SE_RUN_HEAD + GD_SE_RUN_ITEM))' ;;
    11) subst 11 daemon/state.c '    st->ctx->reg.hooks = &hooks;' '    st->ctx->reg.hooks = NULL;' ;;
    12) subst 12 daemon/state.c '        reg->ref_sink = &st->stage;' '        reg->ref_sink = NULL;'
        subst 12 daemon/state.c '    if (st->frozen || st->no_journal)' '    if (1 || st->frozen || st->no_journal)' ;;
    *) echo "bench/journal_variants.sh: no variant $v (0 to 12)" >&2; exit 2 ;;
    esac
    cmake -S "$out/src$v" -B "$out/b$v" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$out/cmake$v.log" 2>&1
    cmake --build "$out/b$v" --target gpubufd gpubuf_bench >"$out/build$v.log" 2>&1 ||
        { echo "bench/journal_variants.sh: variant $v does not build: $out/build$v.log" >&2; exit 1; }
done
read -ra first <<<"$order" # the first variant's gpubuf_bench drives every daemon
read -ra cpus <<<"$(nproc --all) $(nproc)"
last=$((cpus[1] - 1))
pin_d=() pin_w=()
if [ "$last" -ge 2 ] && command -v taskset >/dev/null; then
    pin_d=(taskset -a -p -c "$last")
    pin_w=(taskset -c "0-$((last - 1))")
fi
printf '[daemon]\nstate_journal = switchable\n' >"$out/sw.conf"
sock=$out/s.sock log=$out/d.log
for v in $order; do
    rm -f "$sock"
    "$out/b$v/daemon/gpubufd" --socket "$sock" --log-level info --config "$out/sw.conf" \
        --pool "gpu0=$kind,capacity=32G,slab=64M" 2>"$log" &
    d=$!
    for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
    if [ ! -S "$sock" ]; then
        echo "bench/journal_variants.sh: variant $v: gpubufd did not start ($log)" >&2
        kill $d 2>/dev/null || true
        exit 1
    fi
    if [ ${#pin_d[@]} -gt 0 ]; then "${pin_d[@]}" $d >/dev/null; fi
    rm -rf "$out/p"
    mkdir -p "$out/p"
    "${pin_w[@]}" "$out/b${first[0]}/bench/gpubuf_bench" --socket "$sock" --daemon-pid $d --pool gpu0 \
        --only batchmix --pairs "$out/p" --daemon-log "$log" >"$out/p.txt" 2>&1 ||
        { echo "bench/journal_variants.sh: variant $v: the pair failed ($out/p.txt)" >&2; kill $d; exit 1; }
    kill $d
    wait $d || true
    grep -o 'saved state: .*' "$log" | tail -1 || true
    python3 - "$v" "$out/p" <<'PY'
import glob, statistics, sys
v, d = sys.argv[1], sys.argv[2]
r = {"on": [], "off": []}
for f in glob.glob(d + "/*.txt"):
    side = f.rsplit("/", 1)[1].split("-")[0]
    for line in open(f):
        k, x = line.split()
        if k.startswith("batch_mixed_ops_per_s"):
            r[side].append(float(x))
on, off = statistics.median(r["on"]), statistics.median(r["off"])
print(f"variant {v}: journal on {on / 1e6:.2f}, off {off / 1e6:.2f} M ops/s: {off / on:.3f} x "
      f"(rounds on {min(r['on']) / 1e6:.2f}-{max(r['on']) / 1e6:.2f}, "
      f"off {min(r['off']) / 1e6:.2f}-{max(r['off']) / 1e6:.2f})")
PY
done
