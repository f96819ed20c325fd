#!/usr/bin/env bash
# One GPU session (issue 30), in one go from a plain checkout (no install: PYTHONPATH=.), under 8 minutes on
# one H100: the device, the CUDA tests (4 processes), the command line's forked processes, then
# benchmarks/bench_gpu.py (its Markdown tables, and profiles of the largest reference check and of Linear
# n=128 and 256). Output goes to $OUT if set (else ./gpu-session)
# and to the terminal. The device's python is python3 (PYTHON= to name another).
#
# The CUDA tests have no marker: they skip where torch.cuda.is_available() is false. They are the tests of
# the files that use CUDA whose names say cuda, gpu or device (-k), where a GPU runs them.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-gpu-session}"
py="${PYTHON:-python3}"  # the device machine has python3, not python
# no pip there: the pytest plugin's entry point (pyproject.toml) from a dist-info folder on the path, as an
# install would make it, so the plugin's tests find it
meta="$(mktemp -d)/gradcheck_cli-0.0.0.dist-info"
mkdir -p "$meta"
printf 'Metadata-Version: 2.1\nName: gradcheck-cli\nVersion: 0.0.0\n' >"$meta/METADATA"
printf '[pytest11]\ngradcheck = gradcheck_cli.pytest_plugin\n' >"$meta/entry_points.txt"
export PYTHONPATH="$PYTHONPATH:$(dirname "$meta")"
mkdir -p "$out"

{
  date -u
  nvidia-smi || true
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
  git log --oneline -1 2>/dev/null || true
} 2>&1 | tee "$out/device.txt"

mapfile -t files < <(grep -rl "cuda" tests --include='test_*.py' | sort)
# The device cannot pip install: a test file that imports a test dependency missing there (jsonschema,
# xmlschema) is left out, and said so, rather than stopping the whole run at collection.
for dep in jsonschema xmlschema; do
  "$py" -c "import $dep" 2>/dev/null && continue
  mapfile -t files < <(printf '%s\n' "${files[@]}" | while read -r f; do
    grep -q "^import $dep" "$f" && echo "left out (no $dep here): $f" >&2 || echo "$f"; done)
done
start=$SECONDS
timeout 170 "$py" -m pytest -q -rs -n 4 -p no:cacheprovider "${files[@]}" -k "cuda or gpu or device" \
  --junitxml="$out/cuda-tests.xml" 2>&1 | tee "$out/cuda-tests.txt"
tests_rc=${PIPESTATUS[0]}
echo "CUDA tests: exit $tests_rc in $((SECONDS - start)) s" | tee -a "$out/cuda-tests.txt"

# the command line where a GPU is visible: distributed ranks and the shrinking search are forked processes
# that run backward, which torch refuses after a backward there (tests/cli/test_autograd_fork.py emulates it)
start=$SECONDS
{
  timeout 120 "$py" -m gradcheck_cli specs/relu.yaml specs/distributed.yaml -j 2 2>&1 | tail -4
  timeout 60 "$py" -m gradcheck_cli broken-specs/linear_double_bias.yaml --shrink 30 2>&1 | grep -E "shrunk|result"
  timeout 60 "$py" -m gradcheck_cli broken-specs/linear_double_bias.yaml --shrink 30 --no-isolate 2>&1 |
    grep -E "shrunk|result"
} 2>&1 | tee "$out/cli.txt"
echo "command line: $((SECONDS - start)) s" | tee -a "$out/cli.txt"

bench_rc=0
if [ "${BENCH:-1}" != 0 ]; then  # BENCH=0: the tests and the command line alone (a quick recheck)
  start=$SECONDS
  timeout 250 "$py" benchmarks/bench_gpu.py --profile "$out/profile.txt" 2>&1 | tee "$out/bench_gpu.md"
  bench_rc=${PIPESTATUS[0]}
  echo "bench_gpu: exit $bench_rc in $((SECONDS - start)) s" | tee -a "$out/bench_gpu.md"
fi

[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
