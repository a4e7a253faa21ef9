#!/usr/bin/env bash
# Coverage-guided fuzzing of encore's input surfaces with AFL++ (afl.rs, stable Rust).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]
#
# Builds the targets of fuzz/ with AFL instrumentation, then fuzzes each named target (default:
# all six) for SECONDS_PER_TARGET (default 3600). A target resumes from its previous findings
# in fuzz/out/TARGET when they exist, else starts from the committed seeds in fuzz/corpus/TARGET.
# Afterwards the queue is minimised back into fuzz/corpus/TARGET (commit it) and every crash or
# hang is copied to fuzz/regressions/TARGET, which `cargo test` in fuzz/ replays.
# Needs: cargo install cargo-afl && cargo afl config --build; ENCORE_MODELS for tokenizer_front.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-3600}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(onnx_import model_file ir_text npy tokenizer_front session_inputs)
export ENCORE_MODELS=${ENCORE_MODELS:-$(cd ../../shared/models 2>/dev/null && pwd || echo ../../shared/models)}
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
cargo afl build --release
mkdir -p out
for t in "${targets[@]}"; do
  input=corpus/$t
  [ -d "out/$t/default/queue" ] && input=-
  echo "fuzzing $t for $secs s (input: $input)"
  # -m none: the targets bound their own input size; -t 2000: a case over 2 s is a hang.
  cargo afl fuzz -i "$input" -o "out/$t" -V "$secs" -m none -t 2000 "target/release/$t" > "out/$t.log" 2>&1 || true
  tail -n 25 "out/$t/default/fuzzer_stats" 2>/dev/null | grep -E 'execs_done|corpus_count|saved_crashes|saved_hangs|run_time' || true
  mkdir -p "regressions/$t"
  for f in out/$t/default/crashes/id* out/$t/default/hangs/id*; do
    [ -e "$f" ] && cp "$f" "regressions/$t/$(basename "$(dirname "$f")")-$(sha1sum "$f" | cut -c1-12)"
  done
  tmp=$(mktemp -d)
  # The minimised queue replaces the seeds only when it came out non-empty (afl-cmin can fail
  # quietly, and an empty corpus would lose the seeds).
  # The Python afl-cmin of AFL++ 4.x sometimes records no tuples ("0 unique tuples"); its bash
  # twin, shipped beside it, is the fallback.
  cmin_bash=$(ls -d "$HOME"/.local/share/afl.rs/rustc-*/afl.rs-*/afl/bin 2>/dev/null | tail -n 1)
  if { cargo afl cmin -i "out/$t/default/queue" -o "$tmp/min" -m none -t 2000 -- "target/release/$t" > "out/$t.cmin.log" 2>&1 \
         && [ -n "$(ls -A "$tmp/min" 2>/dev/null)" ]; } \
     || { [ -n "$cmin_bash" ] && rm -rf "$tmp/min" \
         && PATH="$cmin_bash:$PATH" AFL_PATH="$cmin_bash" "$cmin_bash/afl-cmin.bash" -i "out/$t/default/queue" -o "$tmp/min" -m none -t 2000 -- "target/release/$t" > "out/$t.cmin-bash.log" 2>&1 \
         && [ -n "$(ls -A "$tmp/min" 2>/dev/null)" ]; }; then
    rm -rf "corpus/$t" && mv "$tmp/min" "corpus/$t"
  else
    echo "afl-cmin gave nothing for $t (see out/$t.cmin.log): corpus/$t kept"
  fi
  rm -rf "$tmp"
done
