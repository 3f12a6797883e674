#!/usr/bin/env node
// Offline schema check of rendered Kubernetes manifests.
//
//   kubectl kustomize deploy/k8s/overlays/cpu | node deploy/validate/validate.mjs
//
// Reads multi-document YAML on stdin. Each document is built into its
// kubernetes-models class (by apiVersion and kind) and validated against
// the Kubernetes OpenAPI schema compiled into that package. The package
// ignores fields it does not know (the schema has no
// additionalProperties: false), so a typo like `imagee:` would pass; the
// strict check below rejects it. Exits 1 naming each bad object and field.

import { parseAllDocuments } from "yaml";

// --- strict check: fields the schema does not define ----------------------
//
// The package ships its schemas only as compiled validator functions. Those
// read every property their schema defines (`data.image`, `data.name`, ...)
// and enumerate the keys of map-typed objects (labels, resources.limits).
// Running the validator on a proxy that records those reads tells, for
// each object, which of its keys the schema knows: a key never read, in an
// object whose keys were not enumerated, is not in the schema. An object
// the validator read nothing from has no schema (free-form) and is skipped.

function recordingProxy(root) {
  const reads = new WeakMap(); // object -> Set of keys the validator read
  const enumerated = new WeakSet(); // objects whose keys it iterated (maps)
  const proxies = new WeakMap();
  const wrap = (value) => {
    if (value === null || typeof value !== "object") return value;
    if (proxies.has(value)) return proxies.get(value);
    reads.set(value, new Set());
    const note = (target, key) => {
      if (typeof key === "string") reads.get(target).add(key);
    };
    const proxy = new Proxy(value, {
      get(target, key, receiver) {
        note(target, key);
        return wrap(Reflect.get(target, key, receiver));
      },
      has(target, key) {
        note(target, key);
        return Reflect.has(target, key);
      },
      getOwnPropertyDescriptor(target, key) {
        note(target, key);
        return Reflect.getOwnPropertyDescriptor(target, key);
      },
      ownKeys(target) {
        enumerated.add(target);
        return Reflect.ownKeys(target);
      },
    });
    proxies.set(value, proxy);
    return proxy;
  };
  return { proxy: wrap(root), reads, enumerated };
}

function unknownFields(Model, data) {
  const plain = JSON.parse(JSON.stringify(data));
  const { proxy, reads, enumerated } = recordingProxy(plain);
  try {
    // Model.prototype.validate runs the compiled validator on `this`.
    Model.prototype.validate.call(proxy);
  } catch {
    // Schema errors are reported by the plain validate() already.
  }
  const found = [];
  const walk = (value, path) => {
    if (value === null || typeof value !== "object") return;
    if (Array.isArray(value)) {
      value.forEach((item, i) => walk(item, `${path}/${i}`));
      return;
    }
    const seen = reads.get(value);
    if (seen === undefined || seen.size === 0) return; // free-form
    const isMap = enumerated.has(value);
    for (const key of Object.keys(value)) {
      if (!isMap && !seen.has(key)) {
        found.push(`${path}/${key}`);
      } else {
        walk(value[key], `${path}/${key}`);
      }
    }
  };
  walk(plain, "");
  return found;
}

// --- models ----------------------------------------------------------------

async function loadModel(apiVersion, kind) {
  // kubernetes-models/<group>/<version>/<Kind>; the core group is "v1".
  if (!/^([a-z0-9.-]+\/)?v[0-9a-z]+$/.test(apiVersion) || !/^[A-Z][A-Za-z0-9]*$/.test(kind)) {
    return undefined;
  }
  try {
    const module = await import(`kubernetes-models/${apiVersion}/${kind}`);
    return module[kind];
  } catch {
    return undefined;
  }
}

async function main() {
  let input = "";
  for await (const chunk of process.stdin) input += chunk;

  const failures = [];
  let checked = 0;
  const docs = parseAllDocuments(input, { uniqueKeys: true });
  for (const [index, doc] of docs.entries()) {
    const where = `document ${index + 1}`;
    if (doc.errors.length > 0) {
      failures.push(`${where}: YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
      continue;
    }
    const data = doc.toJS();
    if (data === null || data === undefined) continue; // empty document
    if (typeof data !== "object" || Array.isArray(data)) {
      failures.push(`${where}: not a Kubernetes object`);
      continue;
    }
    const { apiVersion, kind } = data;
    const name = `${kind}/${data.metadata?.name ?? "(no name)"} (${apiVersion}, ${where})`;
    if (!data.metadata?.name) {
      failures.push(`${name}: metadata.name is missing`);
    }
    const Model = await loadModel(String(apiVersion), String(kind));
    if (Model === undefined) {
      failures.push(`${name}: no kubernetes-models class for apiVersion ${apiVersion} kind ${kind}`);
      continue;
    }
    checked++;
    try {
      new Model(data).validate();
    } catch (err) {
      failures.push(`${name}: ${err.message}`);
    }
    for (const field of unknownFields(Model, data)) {
      failures.push(`${name}: unknown field ${field}`);
    }
  }

  if (checked === 0 && failures.length === 0) {
    failures.push("no Kubernetes objects on stdin");
  }
  if (failures.length > 0) {
    for (const f of failures) console.error(`validate: FAIL ${f}`);
    process.exit(1);
  }
  console.log(`validate: ok, ${checked} objects`);
}

main().catch((err) => {
  console.error(`validate: ${err.stack ?? err}`);
  process.exit(2);
});
