#!/usr/bin/env bash
# The AMX checks on a machine that has AMX but no Rust toolchain (the accelerator machine a
# session may be lent: its host CPU has had AMX; see crates/codegen/BENCH.md, "AMX on real
# hardware again"). Two steps:
#
#   bash scripts/amx_hw_check.sh pack [BASELINE_ENCORE [VARIANT_ENCORE...]]
#       here: builds the release binaries and the kernel tests, strips them into .devrun/bin.tgz
#       (git-ignored; ~20 MB). With BASELINE_ENCORE (an `encore` built from another commit) the
#       model benchmark runs both, alternating, for an A/B; each VARIANT_ENCORE (say, a
#       schedule under trial) joins the rotation as encore_alt1, encore_alt2, ...
#   bash scripts/amx_hw_check.sh run
#       there (the device tool's `run` with carry [".devrun"]; about 3 minutes): CPU flags; the
#       kernel tests on the hardware tile unit; `bench amx` (the microkernel's schedules);
#       `hwbench` on the BERT-base shapes; BERT-base INT8 (static + int8 attention) built and
#       quantized there, its outputs under ENCORE_KERNEL=amx and =avx512vnni compared byte for
#       byte; `encore bench` AMX against VNNI (and baseline against new) at batch 1, 8 and 32
#       (AMX_HW_CHECK_ROUNDS alternating rounds, default 2; AMX_HW_CHECK_KERNELS, default
#       "amx avx512vnni"), then `bench --profile` at batch 8 on
#       AMX. With a baseline, hwbench and the profile run both binaries too. Everything is logged
#       to $OUT/amx_hw_check.log. Exits non-zero when a test fails or the outputs differ.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=.devrun

pack() {
    mkdir -p "$DEV"
    rm -rf "$DEV/bin" && mkdir -p "$DEV/bin"
    cargo build --release --bin encore
    strip -o "$DEV/bin/encore" target/release/encore
    if [[ -n "${1:-}" ]]; then
        strip -o "$DEV/bin/encore_baseline" "$1"
        shift
        local i=1
        for alt in "$@"; do
            strip -o "$DEV/bin/encore_alt$i" "$alt"
            i=$((i + 1))
        done
    fi
    # The kernel tests and the AMX bench, found by name in cargo's list of built executables.
    local list
    list=$( (cargo test --release -p codegen --no-run --message-format=json;
             cargo bench -p codegen --bench amx --no-run --message-format=json) 2>/dev/null |
        python3 -c '
import json, sys
want = {"codegen", "int8_gemm", "epilogue", "blocking", "jit", "select_pool", "env_override", "amx"}
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        print(m["target"]["name"], m["executable"])
')
    while read -r name exe; do
        strip -o "$DEV/bin/$name" "$exe"
    done <<<"$list"
    ls "$DEV/bin"
    tar -czf "$DEV/bin.tgz" -C "$DEV/bin" . && rm -rf "$DEV/bin"
    echo "packed $(du -h "$DEV/bin.tgz" | cut -f1) into $DEV/bin.tgz; on the device: bash scripts/amx_hw_check.sh run (carry .devrun)"
}

run() {
    local out=${OUT:-/tmp/amx_hw_check} b=/tmp/amx_hw_bin w=/tmp/amx_hw_work fail=0
    mkdir -p "$out" "$b" "$w"
    tar -xzf "$DEV/bin.tgz" -C "$b"
    exec > >(tee -a "$out/amx_hw_check.log") 2>&1
    sec() { echo; echo "=== $* ($(date -u +%T))"; }
    sec cpu
    lscpu | grep -E "Model name|CPU family|Model:|^CPU\(s\)|L1d|L2|L3" || true
    grep -m1 -o -w -E "amx_int8|amx_tile|avx512_vnni|avx_vnni" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
    if ! grep -q -w amx_int8 /proc/cpuinfo; then
        if [[ "${AMX_HW_CHECK_ANYWAY:-}" != 1 ]]; then
            echo "SKIP: this CPU has no AMX-INT8; nothing to check here (AMX_HW_CHECK_ANYWAY=1 runs the rest as a dry run: ENCORE_KERNEL=amx then falls back with a warning)"
            return 0
        fi
        echo "dry run without AMX (AMX_HW_CHECK_ANYWAY=1)"
    fi
    sec kernel tests on the hardware tile unit
    for t in codegen int8_gemm epilogue blocking jit select_pool env_override; do
        [[ -x "$b/$t" ]] || { echo "MISSING test binary $t"; fail=1; continue; }
        if timeout 300 "$b/$t" --test-threads "$(nproc)" >"$w/$t.log" 2>&1; then
            grep -E "^test result" "$w/$t.log" | sed "s/^/$t: /"
        else
            echo "FAILED: $t"; grep -E "panicked|FAILED|failed" "$w/$t.log" | head -20; fail=1
        fi
    done
    sec the microkernel alone
    "$b/amx" || fail=1
    local bins=(encore)
    [[ -x "$b/encore_baseline" ]] && bins=(encore_baseline encore)
    for alt in "$b"/encore_alt*; do
        [[ -x "$alt" ]] && bins+=("$(basename "$alt")")
    done
    sec hwbench, M = 1024, 1 thread
    for nk in "768 768" "2304 768" "3072 768" "768 3072"; do
        set -- $nk
        for bin in "${bins[@]}"; do
            "$b/$bin" hwbench --m 1024 --n "$1" --k "$2" --threads 1 |
                grep -E "^(amx|avx512vnni) " | sed "s/^/$bin /"
        done
    done
    sec BERT-base INT8, static + int8 attention
    "$b/encore" build-model --preset bert-base --out "$w/m.onnx"
    "$b/encore" quantize --model "$w/m.onnx" --random-calibration 64 --seq 128 \
        --activations static --attention int8 --quiet --out "$w/m.encore"
    python3 - "$w" <<'PY'
import random, struct, sys
def save(path, rows):
    h = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, %d), }" % (len(rows), len(rows[0]))
    h += " " * (63 - (len(h) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        for r in rows:
            f.write(struct.pack("<%dq" % len(r), *r))
w, rnd, lens = sys.argv[1], random.Random(7), [128, 77, 128, 5]
save(w + "/ids.npy", [[101] + [rnd.randrange(1000, 30000) for _ in range(126)] + [102] for _ in lens])
save(w + "/tt.npy", [[0] * 128 for _ in lens])
save(w + "/mask.npy", [[1] * n + [0] * (128 - n) for n in lens])
PY
    sec outputs, AMX against AVX512-VNNI
    for k in amx avx512vnni; do
        ENCORE_KERNEL=$k "$b/encore" run --model "$w/m.encore" --input input_ids="$w/ids.npy" \
            --input attention_mask="$w/mask.npy" --input token_type_ids="$w/tt.npy" \
            --output-dir "$w/out_$k" >/dev/null
    done
    for f in "$w"/out_amx/*.npy; do
        if cmp -s "$f" "$w/out_avx512vnni/$(basename "$f")"; then
            echo "identical: $(basename "$f")"
        else
            echo "DIFFERENT: $(basename "$f")"; fail=1
        fi
    done
    sec encore bench, 2 threads, alternating
    for round in $(seq "${AMX_HW_CHECK_ROUNDS:-2}"); do
        for batch in 1 8 32; do
            for bin in "${bins[@]}"; do
                for k in ${AMX_HW_CHECK_KERNELS:-amx avx512vnni}; do
                    printf 'round %s batch %2s %-16s %-11s ' "$round" "$batch" "$bin" "$k"
                    ENCORE_KERNEL=$k "$b/$bin" bench --model "$w/m.encore" --batch "$batch" \
                        --threads 2 --seconds 2.5 --min-runs 3 2>&1 |
                        grep -E "sequences/s|ignoring" | tr -s ' ' | tr '\n' ' '
                    echo
                done
            done
        done
    done
    sec "bench --profile, batch 8, 2 threads, AMX"
    for bin in "${bins[@]}"; do
        echo "$bin"
        ENCORE_KERNEL=amx "$b/$bin" bench --model "$w/m.encore" --batch 8 --threads 2 \
            --seconds 2 --min-runs 3 --profile 2>&1 | grep -E -A6 "sequences/s|roofline"
    done
    sec done
    return "$fail"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    run) run ;;
    *) echo "usage: $0 pack [BASELINE_ENCORE [VARIANT_ENCORE...]] | run" >&2; exit 2 ;;
esac
