#!/usr/bin/env bash
# Checks the deployment manifests offline:
#  1. every overlay in deploy/k8s/overlays/ renders with `kubectl kustomize`
#     and every rendered object passes deploy/validate/validate.mjs (the
#     Kubernetes schema from kubernetes-models, plus unknown fields);
#  2. the validator rejects a manifest with a typo (`imagee:`), so this
#     check cannot pass by checking nothing;
#  3. yamllint -c .yamllint on deploy/.
# Needs kubectl, node, yamllint and `npm ci` in deploy/validate.
set -euo pipefail
cd "$(dirname "$0")/.."

VALIDATE=deploy/validate/validate.mjs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail=0
overlays=(deploy/k8s/overlays/*/)
if [ ! -e "${overlays[0]}" ]; then
  echo "check: no overlays under deploy/k8s/overlays" >&2
  exit 1
fi

for dir in "${overlays[@]}"; do
  overlay=$(basename "$dir")
  rendered="$tmp/$overlay.yaml"
  if ! kubectl kustomize "$dir" >"$rendered"; then
    echo "check: FAIL $overlay: kubectl kustomize $dir" >&2
    fail=1
    continue
  fi
  if out=$(node "$VALIDATE" <"$rendered" 2>&1); then
    echo "check: ok $overlay: $out"
  else
    echo "$out" >&2
    echo "check: FAIL $overlay" >&2
    fail=1
  fi
done

# Negative self-test: a misspelt container field must be rejected, by name.
first=$(basename "${overlays[0]}")
# After `image:` add a sibling key at the same column (after "- " if the
# container starts with it).
sed -E -e 's/^( *)image: .*$/&\n\1imagee: x/' \
  -e 's/^( *)- image: .*$/&\n\1  imagee: x/' "$tmp/$first.yaml" >"$tmp/typo.yaml"
if ! grep -q 'imagee: x' "$tmp/typo.yaml"; then
  echo "check: FAIL self-test: could not inject a typo into $first" >&2
  fail=1
elif out=$(node "$VALIDATE" <"$tmp/typo.yaml" 2>&1); then
  echo "check: FAIL self-test: the validator accepted 'imagee:' in $first" >&2
  fail=1
elif ! grep -q 'unknown field .*/imagee' <<<"$out"; then
  echo "$out" >&2
  echo "check: FAIL self-test: the validator failed, but not on 'imagee'" >&2
  fail=1
else
  echo "check: ok self-test: the validator rejects a typo ($(grep -m1 imagee <<<"$out" | sed 's/^validate: FAIL //'))"
fi

if yamllint -c .yamllint --strict deploy/; then
  echo "check: ok yamllint deploy/"
else
  echo "check: FAIL yamllint deploy/" >&2
  fail=1
fi

if [ "$fail" -ne 0 ]; then
  echo "check: FAILED" >&2
  exit 1
fi
echo "check: all passed"
