#!/usr/bin/env bash
# ctest entry for the deployment manifests: runs deploy/check.sh.
# Exits 77 (ctest SKIP_RETURN_CODE) naming what is missing when a tool is
# absent, unless STARLING_REQUIRE_DEPLOY_TOOLS=1, which makes that a failure.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
root=$(cd "$here/../.." && pwd)

missing=()
for tool in kubectl node yamllint; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ! -d "$root/deploy/validate/node_modules/kubernetes-models" ] ||
   [ ! -d "$root/deploy/validate/node_modules/yaml" ]; then
  missing+=("deploy/validate/node_modules (run: npm ci --prefix deploy/validate)")
fi

if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do echo "manifests_test: missing: $m" >&2; done
  if [ "${STARLING_REQUIRE_DEPLOY_TOOLS:-0}" = "1" ]; then
    echo "manifests_test: FAIL (STARLING_REQUIRE_DEPLOY_TOOLS=1)" >&2
    exit 1
  fi
  echo "manifests_test: SKIP"
  exit 77
fi

exec "$root/deploy/check.sh"
