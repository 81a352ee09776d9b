// Validates Kubernetes objects with the models of the npm packages in package.json beside this
// file (installed by scripts/setup-deploy.sh into NODE_MODULES, the first argument).
//
//   node validate.mjs NODE_MODULES     then one JSON object per stdin line; one answer per line:
//     {"validator": "<package> <apiVersion> <kind>", "errors": ["<path>: <message>", ...]}
//     {"validator": null}   when no package has a model for that apiVersion and kind
//
// A model is <package>/<group>/<version>/<Kind>.js (<package>/<version>/<Kind>.js for the core
// group), a class whose apiVersion and kind are the object's; validate() throws with the
// schema's errors (types, enums, patterns, required fields; the packages do not reject
// unknown fields).
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = process.argv[2];
if (!modules || !fs.existsSync(modules)) {
  console.error(`validate.mjs: no node_modules at ${modules} (run scripts/setup-deploy.sh)`);
  process.exit(2);
}
const packages = Object.keys(JSON.parse(fs.readFileSync(path.join(here, "package.json"))).dependencies);

const cache = new Map();
async function model(apiVersion, kind) {
  const key = `${apiVersion} ${kind}`;
  if (cache.has(key)) return cache.get(key);
  let found = null;
  if (typeof apiVersion === "string" && typeof kind === "string" && /^[A-Za-z0-9]+$/.test(kind)) {
    const parts = apiVersion.split("/");
    for (const pkg of packages) {
      const file = path.join(modules, pkg, ...parts, `${kind}.js`);
      if (!fs.existsSync(file)) continue;
      const cls = (await import(pathToFileURL(file).href))[kind];
      if (cls && cls.apiVersion === apiVersion && cls.kind === kind) {
        found = { name: `${pkg} ${apiVersion} ${kind}`, cls };
        break;
      }
    }
  }
  cache.set(key, found);
  return found;
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of rl) {
  if (!line.trim()) continue;
  const doc = JSON.parse(line);
  const m = await model(doc.apiVersion, doc.kind);
  if (m === null) {
    process.stdout.write(JSON.stringify({ validator: null }) + "\n");
    continue;
  }
  let errors = [];
  try {
    new m.cls(doc).validate();
  } catch (e) {
    const list = Array.isArray(e.errors) ? e.errors : [{ instancePath: "", message: String(e.message) }];
    errors = list.map((x) => `${x.instancePath || "(root)"}: ${x.message}${x.params ? " " + JSON.stringify(x.params) : ""}`);
  }
  process.stdout.write(JSON.stringify({ validator: m.name, errors }) + "\n");
}
