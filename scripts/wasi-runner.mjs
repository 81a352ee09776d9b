// Runs a wasm32-wasip1 test binary under Node's WASI, with Node's V8 (the engine Envoy embeds),
// so the core's unit tests also run on the wasm code paths, SIMD included:
//
//   CARGO_TARGET_WASM32_WASIP1_RUNNER="node scripts/wasi-runner.mjs" \
//     cargo test --target wasm32-wasip1 --lib core::
//
// The library also holds the proxy-wasm glue, whose host imports ("env") are stubbed: the core
// tests never call them. The file system root is preopened (proptest reads its regression files).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import process from 'node:process';

const [wasmPath, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: 'preview1',
  args: [wasmPath, ...args],
  env: process.env,
  preopens: { '/': '/' },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(wasmPath));
const imports = wasi.getImportObject();
for (const imp of WebAssembly.Module.imports(module)) {
  if (imp.module === 'wasi_snapshot_preview1') continue;
  imports[imp.module] ??= {};
  imports[imp.module][imp.name] = () => { throw new Error(`host call ${imp.name} in a core test`); };
}
const instance = await WebAssembly.instantiate(module, imports);
// The library exports `_initialize` (proxy-wasm); WASI.start wants a command module only.
const code = wasi.start({ exports: { memory: instance.exports.memory, _start: instance.exports._start } });
process.exit(code ?? 0);
