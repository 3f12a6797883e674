#!/usr/bin/env bash
# Measures inner-step throughput of the KJV recipe in C++ (Starling) and in
# plain PyTorch on the same machine and threads, and writes one JSON object
# with both figures and their ratio.
#   bench/compare_kjv.sh [OUT.json]   (default: bench-kjv.json)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-kjv.json}
tmp=$(mktemp -d)
build/bench/inner_step_bench --benchmark_format=json \
  --benchmark_out="$tmp/cpp.json" --benchmark_out_format=json >/dev/null
/usr/bin/python3 bench/pytorch_kjv.py --steps 300 --eval_every 1000000 --threads 1 \
  --json "$tmp/py.json" >/dev/null
/usr/bin/python3 - "$tmp/cpp.json" "$tmp/py.json" "$out" <<'PY'
import json, sys
cpp = json.load(open(sys.argv[1]))["benchmarks"][0]
py = json.load(open(sys.argv[2]))
cpp_ms = cpp["real_time"]  # milliseconds per step
result = {
    "recipe": "kjv gpt layers=2 width=64 heads=4 context=64 batch=16 threads=1",
    "starling_ms_per_step": cpp_ms,
    "starling_tokens_per_second": cpp["items_per_second"],
    "pytorch_ms_per_step": py["ms_per_step"],
    "pytorch_tokens_per_second": py["tokens_per_second"],
    "speedup_vs_pytorch": py["ms_per_step"] / cpp_ms,
}
json.dump(result, open(sys.argv[3], "w"), indent=2)
print(json.dumps(result, indent=2))
PY
rm -rf "$tmp"
