#!/usr/bin/env bash
# Builds a self-contained bundle of a CUDA build for a GPU machine that has only the NVIDIA driver:
#   tools/gpu_bundle.sh BUILD_DIR NAME      e.g. tools/gpu_bundle.sh build-cuda hopper
#                                           (tools/build_volta.sh makes dist/volta this way)
# writes dist/NAME/ with ferry, ferry_gpu_tests, every shared library they load that is not part of
# the C runtime or the driver (libstdc++ and the CUDA runtime included: the target's may be older or
# missing), a copy of the reference fixtures and run-gpu-tests.sh, which runs the cuda-labelled tests
# and the eval-ref checks in one command. The binaries find their libraries through RPATH $ORIGIN/lib.
#
# cuBLAS (~600 MB) is loaded at run time, not linked (gpu/cuda_blas.hpp), so it is not bundled:
# run-gpu-tests.sh takes the target's (CUDA toolkit, or the nvidia-cublas wheels next to PyTorch).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: tools/gpu_bundle.sh BUILD_DIR NAME}
name=${2:?usage: tools/gpu_bundle.sh BUILD_DIR NAME}
out=dist/$name
command -v patchelf >/dev/null || { echo "gpu_bundle: needs patchelf (apt-get install patchelf)" >&2; exit 2; }
[ -x "$build/ferry" ] && [ -x "$build/tests/ferry_gpu_tests" ] || {
  echo "gpu_bundle: build ferry and ferry_gpu_tests in $build first" >&2; exit 2; }
# The architectures the build has device code for, as its compile commands name them.
archs=$(grep -o 'sm_[0-9]*' "$build/compile_commands.json" | sort -u | paste -sd ' ')
[ -n "$archs" ] || { echo "gpu_bundle: $build/compile_commands.json names no sm_NN architecture" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/lib" "$out/fixtures"
cp "$build/ferry" "$build/tests/ferry_gpu_tests" "$out/"

# glibc and the loader come from the target (the binaries need at most this machine's glibc, and GPU
# hosts run newer ones); the driver (libcuda, libnvidia-*) must be the target's own.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|libcuda\.so|libnvidia-)'
for bin in "$out/ferry" "$out/ferry_gpu_tests"; do
  ldd "$bin" | awk '/=>/ { print $1, $3 }' | while read -r soname path; do
    [[ "$soname" =~ $skip ]] && continue
    [ -f "$path" ] || { echo "gpu_bundle: $bin needs $soname, which is not found" >&2; exit 2; }
    [ -f "$out/lib/$soname" ] || cp -L "$path" "$out/lib/$soname"
  done
done
for f in "$out/ferry" "$out/ferry_gpu_tests"; do patchelf --set-rpath '$ORIGIN/lib' "$f"; done
for f in "$out"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f" 2>/dev/null || true; done
cp -r tests/fixtures/glm5/. "$out/fixtures/"
# The user's two mixes (ferry convert --recipe, ferry bench --synthetic ... --recipe).
mkdir -p "$out/recipes" && cp model/glm5/recipes/*.recipe "$out/recipes/"
# The model shapes for synthetic benchmarks, when the shared folder sits beside the checkout.
if [ -d ../shared/configs ]; then mkdir -p "$out/configs" && cp ../shared/configs/*.json "$out/configs/"; fi

printf '#!/usr/bin/env bash\nbuilt_for="%s"  # the architectures the build has code for\n' "$archs" > "$out/run-gpu-tests.sh"
cat >> "$out/run-gpu-tests.sh" <<'RUN'
# Runs on the GPU machine: the cuda-labelled tests, then every reference fixture through
# `ferry eval-ref --backend cuda` (f32 weights and KV: max |delta| <= 5e-3 vs transformers; q4_k, q8_0
# and the two recipes of recipes/ (the user's mixes: IQ3_S / Q5_K / IQ4_XS and Q4_K / Q5_K / Q6_K /
# Q8_0), with the default KV type: top-1 agreement with the CPU backend >= 99.5%), the f32 conversions also with no expert pool (each
# prefill miss path) and split into 2, 3 and 4 stages on device 0 (as the fixture's layers allow),
# f32 with a resident KV window smaller than the case (--kv-resident), then which device code ran: on a GPU whose architecture
# the build has no code for (the Volta build on a newer GPU), it must be code the driver compiled
# from the embedded PTX. Extra arguments go to the GoogleTest binary.
# Exit status: the number of failed checks (0 = all passed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# cuBLAS, loaded at run time: the CUDA toolkit's or PyPI's (next to PyTorch), or FERRY_CUBLAS_PATH's.
extra=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && extra="$extra:$d"
done
export LD_LIBRARY_PATH="$here/lib${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The driver's cache of code it compiled from PTX, so that a build run from PTX (the Volta build on a
# newer GPU) is compiled once for all the runs below even where $HOME is not writable.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-${TMPDIR:-/tmp}/ferry-cuda-cache}
# Its default cap may hold less than both binaries' compiled code, and what one process evicts the next
# compiles again (the Volta build's eval-ref checks ran past 320 s on the H200): 4 GiB, the largest cap.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
work=${TMPDIR:-/tmp}/ferry-gpu-tests.$$
mkdir -p "$work"
failed=0
kernels=""  # as the backend names them: "sm_90 (cuBLAS ...)", "sm_90 from compute_70 PTX (cuBLAS ...)"
"$here/ferry" --version || failed=$((failed + 1))
"$here/ferry_gpu_tests" --gtest_brief=1 "$@" || failed=$((failed + 1))
for case_dir in "$here"/fixtures/*/; do
  case=$(basename "$case_dir")
  [ -f "$case_dir/reference.json" ] || continue
  for t in f32 q8_0 q4_k "$here"/recipes/*.recipe; do
    if [[ "$t" == *.recipe ]]; then
      how=(--recipe "$t")
      t=$(basename "$t" .recipe)
    else
      how=(--type "$t")
    fi
    if ! "$here/ferry" convert "$case_dir" "$work/$case-$t.gguf" "${how[@]}" --quiet >"$work/convert.log" 2>&1; then
      echo "FAIL convert $case $t"; cat "$work/convert.log"; failed=$((failed + 1)); continue
    fi
    if [ "$t" = f32 ]; then
      args=(--tolerance 5e-3 --kv-type f32)
    else
      args=(--compare-cpu --min-top1 0.995 --threads 8)
    fi
    for chunk in 0 7; do
      "$here/ferry" eval-ref --backend cuda --model "$work/$case-$t.gguf" --reference "$case_dir" --chunk $chunk \
        "${args[@]}" >"$work/eval.log" 2>&1
      status=$?
      [ -n "$kernels" ] || kernels=$(sed -n 's/.*(kernels \([^,]*\), cuBLAS \([^)]*\)).*/\1 (cuBLAS \2)/p' "$work/eval.log" | head -n 1)
      if [ $status -eq 0 ]; then
        echo "PASS eval-ref $case $t chunk $chunk: $(grep -E 'max\|delta\||vs cpu' "$work/eval.log" | tr '\n' ' ')"
      else
        echo "FAIL eval-ref $case $t chunk $chunk"; cat "$work/eval.log"; failed=$((failed + 1))
      fi
    done
  done
  # Routed experts beyond the device: no pool at all (every route misses), each prefill miss path,
  # whole and in chunks of 7 (the decode kernels); the logits must not move.
  for miss in mapped upload; do
    for chunk in 0 7; do
      if "$here/ferry" eval-ref --backend cuda --model "$work/$case-f32.gguf" --reference "$case_dir" --chunk $chunk \
          --tolerance 5e-3 --kv-type f32 --expert-pool-cap 1 --miss-path $miss >"$work/eval.log" 2>&1; then
        echo "PASS eval-ref $case f32 no pool, $miss, chunk $chunk: $(grep -E 'max\|delta\||^experts' "$work/eval.log" | tr '\n' ' ')"
      else
        echo "FAIL eval-ref $case f32 no pool, $miss, chunk $chunk"; cat "$work/eval.log"; failed=$((failed + 1))
      fi
    done
  done
  # The same f32 case as pipeline stages on one device: boundaries spread evenly over its layers.
  layers=$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$case_dir/config.json" | head -n 1)
  for stages in 2 3 4; do
    [ -n "$layers" ] && [ "$stages" -le "$layers" ] || continue
    split=$(seq 1 $((stages - 1)) | while read -r i; do echo $((i * layers / stages)); done | paste -sd,)
    if "$here/ferry" eval-ref --backend cuda --split "$split" --model "$work/$case-f32.gguf" --reference "$case_dir" \
        --chunk 7 --tolerance 5e-3 --kv-type f32 >"$work/eval.log" 2>&1; then
      echo "PASS eval-ref $case f32 split $split: $(grep -E 'max\|delta\|' "$work/eval.log" | tr '\n' ' ')"
    else
      echo "FAIL eval-ref $case f32 split $split"; cat "$work/eval.log"; failed=$((failed + 1))
    fi
  done
  # The resident KV window smaller than the case (issue 12): the rows past it in the host tier, the
  # prefill reading them there, decode (and chunks of 7) fetching its selections through CLOCK; f32
  # weights and KV, the same tolerance. Cases whose one row selects more than their length are left out.
  topk=$(sed -n 's/.*"index_topk": *\([0-9]*\).*/\1/p' "$case_dir/config.json" | head -n 1)
  kpool=$(sed -n 's/.*"index_kpool": *\([0-9]*\).*/\1/p' "$case_dir/config.json" | head -n 1)
  length=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(len(r["input_ids"]) + len(r["decode_tokens"]))' \
    "$case_dir/reference.json" 2>/dev/null)
  if [ -n "$topk" ] && [ -n "$kpool" ] && [ -n "$length" ]; then
    window=$((topk / kpool * kpool + kpool + 4))
    if [ "$window" -lt "$length" ]; then
      for chunk in 0 7; do
        if "$here/ferry" eval-ref --backend cuda --model "$work/$case-f32.gguf" --reference "$case_dir" --chunk $chunk \
            --tolerance 5e-3 --kv-type f32 --kv-resident "$window" >"$work/eval.log" 2>&1 &&
            grep -q '^kv window' "$work/eval.log"; then
          echo "PASS eval-ref $case f32 --kv-resident $window, chunk $chunk: $(grep -E 'max\|delta\||^kv window' "$work/eval.log" | tr '\n' ' ')"
        else
          echo "FAIL eval-ref $case f32 --kv-resident $window, chunk $chunk"; cat "$work/eval.log"; failed=$((failed + 1))
        fi
      done
    fi
  fi
done
sm=${kernels%% *}
if [ -z "$kernels" ]; then
  echo "FAIL device code: no eval-ref run named it"; failed=$((failed + 1))
elif [[ " $built_for " != *" $sm "* && "$kernels" != *" PTX "* ]]; then
  echo "FAIL device code: $kernels, but the build has code for $built_for only"; failed=$((failed + 1))
else
  echo "PASS device code: $kernels; the build has code for $built_for"
fi
rm -rf "$work"
echo "run-gpu-tests: $failed failed check(s)"
exit $failed
RUN
chmod +x "$out/run-gpu-tests.sh"
du -sh "$out"
