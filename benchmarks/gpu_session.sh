#!/usr/bin/env bash
# One GPU session (issue 30), in one go from a plain checkout (no install: PYTHONPATH=.), under 8 minutes on
# one H100: the device, the CUDA tests, then benchmarks/bench_gpu.py (its Markdown tables, and a profile of
# the largest reference check). Output goes to $OUT if set (else ./gpu-session) and to the terminal.
#
# The CUDA tests have no marker: they skip where torch.cuda.is_available() is false. They are the tests of
# the files that use CUDA whose names say cuda, gpu or device (-k), where a GPU runs them.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-gpu-session}"
mkdir -p "$out"

{
  date -u
  nvidia-smi || true
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  git log --oneline -1 2>/dev/null || true
} 2>&1 | tee "$out/device.txt"

mapfile -t files < <(grep -rl "cuda" tests --include='test_*.py' | sort)
start=$SECONDS
timeout 180 python -m pytest -q -rs -p no:cacheprovider "${files[@]}" -k "cuda or gpu or device" \
  --junitxml="$out/cuda-tests.xml" 2>&1 | tee "$out/cuda-tests.txt"
tests_rc=${PIPESTATUS[0]}
echo "CUDA tests: exit $tests_rc in $((SECONDS - start)) s" | tee -a "$out/cuda-tests.txt"

start=$SECONDS
timeout 280 python benchmarks/bench_gpu.py --profile "$out/profile.txt" 2>&1 | tee "$out/bench_gpu.md"
bench_rc=${PIPESTATUS[0]}
echo "bench_gpu: exit $bench_rc in $((SECONDS - start)) s" | tee -a "$out/bench_gpu.md"

[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
