// One call's isolate: a worker thread of the runtime process (runtime.mjs).
//
// It evaluates the plugin's sources anew (its own module cache, its own
// globals), so nothing a previous call left (globals, the registry, a patched
// `host`, a polluted prototype) exists here. In "serve" mode it then waits for
// exactly one call, runs the handler and reports; the runtime ends it after.
// In "register" mode it reports the registry (the publish check).
//
// Messages to the main thread: {op: "ready", error?}, {op: "host", id, chain, args},
// {op: "done", ...}, {op: "registry", ...}. Host answers come back as
// {op: "answer", id, value} or {op: "answer", id, error}.
import { parentPort, workerData } from "node:worker_threads";
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { pathToFileURL } from "node:url";
import vm from "node:vm";

const { mode, root } = workerData;
// [{source, kind: "cjs", code} | {source, kind: "import"}], prepared by runtime.mjs.
const prepared = workerData.sources;
const sources = prepared.map((p) => p.source);
const NOT_NOW = "the host API is not available while registering";
// A member name: an identifier. Anything else ("a.b", "", symbols) would let a
// built name read as another chain; the bridge checks the chain it gets as is.
const MEMBER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

let inCall = false;
let nextId = 0;
const pending = new Map();

function hostCall(chain, args) {
  if (!inCall) throw new Error(NOT_NOW);
  let payload;
  try {
    payload = JSON.stringify(args);
  } catch (error) {
    return Promise.reject(new TypeError(`host.${chain}: the arguments are not JSON (${error.message})`));
  }
  const id = ++nextId;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    parentPort.postMessage({ op: "host", id, chain, args: payload });
  });
}

function member(path) {
  const target = function host() {};
  return new Proxy(target, {
    get(_target, prop) {
      if (typeof prop !== "string" || prop === "then") return undefined;
      if (!MEMBER.test(prop)) return undefined;
      return member(path ? `${path}.${prop}` : prop);
    },
    apply(_target, _this, args) {
      if (!path) throw new TypeError("host is not a function");
      return hostCall(path, args);
    },
    set: () => false,
    defineProperty: () => false,
    deleteProperty: () => false,
    setPrototypeOf: () => false,
    getPrototypeOf: () => null,
  });
}

Object.defineProperty(globalThis, "host", {
  value: member(""),
  writable: false,
  configurable: false,
  enumerable: false,
});
globalThis.tools = {};

function describe(error) {
  if (error instanceof Error) return String(error.message);
  try {
    return String(error);
  } catch {
    return "a value that cannot be shown";
  }
}

// "<file>:<line>" of the first place in a plugin source named by the error.
function where(error) {
  const stack = error instanceof Error && typeof error.stack === "string" ? error.stack : "";
  const escaped = root.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const found = stack.match(new RegExp(`(?:file://)?${escaped}/([^\\s:()]+):(\\d+)`));
  return found ? { file: found[1], line: Number(found[2]) } : null;
}

const registeredBy = new Map();
let manifestBy = null;

async function load() {
  for (const { source, kind, code } of prepared) {
    const before = globalThis.manifest;
    const filename = `${root}/${source}`;
    try {
      if (kind === "cjs") {
        // What Node's CommonJS loader does with the file, minus the loader.
        const params = ["exports", "require", "module", "__filename", "__dirname"];
        const run = vm.compileFunction(code, params, { filename });
        const module = { exports: {} };
        run.call(module.exports, module.exports, createRequire(filename), module, filename, dirname(filename));
      } else {
        await import(pathToFileURL(filename).href);
      }
    } catch (error) {
      const at = where(error);
      return { source, file: at ? at.file : source, line: at ? at.line : null, message: describe(error) };
    }
    const registry = globalThis.tools;
    if (registry !== null && typeof registry === "object") {
      for (const key of Object.keys(registry)) if (!registeredBy.has(key)) registeredBy.set(key, source);
    }
    if (globalThis.manifest !== before) manifestBy = source;
  }
  return null;
}

// Why `value` is not plain JSON (null, booleans, finite numbers, strings,
// arrays and plain objects only), as [path, message], or null.
function notJson(value, path, seen) {
  if (value === null || typeof value === "string" || typeof value === "boolean") return null;
  if (typeof value === "number") return Number.isFinite(value) ? null : [path, `${value} is not a JSON number`];
  if (typeof value !== "object") return [path, `is ${typeof value === "function" ? "a function" : `a ${typeof value}`}, not JSON`];
  if (seen.has(value)) return [path, "refers to itself (a cycle), not JSON"];
  seen.add(value);
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = notJson(value[i], [...path, i], seen);
      if (found) return found;
    }
  } else {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      const name = proto && proto.constructor && typeof proto.constructor.name === "string" ? proto.constructor.name : "non-plain";
      return [path, `is a ${name} object, not plain JSON`];
    }
    for (const key of Reflect.ownKeys(value)) {
      if (typeof key === "symbol") return [path, "has a symbol key, not JSON"];
      const d = Object.getOwnPropertyDescriptor(value, key);
      if (!("value" in d)) return [[...path, key], "is a getter, not plain JSON"];
      if (!d.enumerable) return [[...path, key], "is not enumerable, not plain JSON"];
      const found = notJson(d.value, [...path, key], seen);
      if (found) return found;
    }
  }
  seen.delete(value);
  return null;
}

function field(entry, name) {
  try {
    return { value: entry[name] };
  } catch (error) {
    return { error: describe(error) };
  }
}

function kindOf(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

function registry() {
  const tools = globalThis.tools;
  const found = { tools: [], registryType: kindOf(tools), manifest: null, manifestSource: manifestBy };
  if (tools !== null && typeof tools === "object") {
    for (const key of Object.keys(tools)) {
      const entry = field(tools, key);
      const item = { key, source: registeredBy.get(key) ?? sources[sources.length - 1] };
      if ("error" in entry) {
        item.error = entry.error;
      } else if (typeof entry.value === "function") {
        item.type = "function";
      } else if (entry.value === null || typeof entry.value !== "object") {
        item.type = kindOf(entry.value);
      } else {
        item.type = "object";
        for (const name of ["description", "handler", "parameters", "alwaysListed", "deferred"]) {
          const got = field(entry.value, name);
          if ("error" in got) {
            item[name] = { error: got.error };
            continue;
          }
          const v = got.value;
          if (name === "parameters" && v !== undefined) {
            const problem = notJson(v, [], new Set());
            item[name] = problem ? { type: kindOf(v), notJson: problem } : { type: kindOf(v), value: v };
          } else if (name === "handler") {
            item[name] = { type: kindOf(v) };
          } else {
            item[name] = { type: kindOf(v), value: typeof v === "string" || typeof v === "boolean" ? v : undefined };
          }
        }
      }
      found.tools.push(item);
    }
  }
  const manifest = globalThis.manifest;
  if (manifest !== undefined) {
    const problem = notJson(manifest, [], new Set());
    found.manifest = problem ? { type: kindOf(manifest), notJson: problem } : { type: kindOf(manifest), value: manifest };
  }
  return found;
}

function deepFreeze(value) {
  if (value !== null && typeof value === "object") {
    for (const key of Object.keys(value)) deepFreeze(value[key]);
    Object.freeze(value);
  }
  return value;
}

function isMemoryError(error) {
  return error instanceof RangeError && /allocation failed|out of memory/i.test(error.message);
}

async function call(message) {
  const { key, input, context, keepChars } = message;
  const tools = globalThis.tools;
  const entry = tools !== null && typeof tools === "object" ? tools[key] : undefined;
  if (!entry || typeof entry.handler !== "function") {
    return { op: "done", ok: false, kind: "error", message: "this tool is no longer registered by the plugin's sources" };
  }
  let value;
  inCall = true;
  try {
    value = await entry.handler(input, deepFreeze(context));
  } catch (error) {
    if (isMemoryError(error)) return { op: "done", ok: false, kind: "memory", message: describe(error) };
    return { op: "done", ok: false, kind: "error", message: describe(error) };
  }
  let text;
  try {
    text = JSON.stringify(value === undefined ? null : value);
  } catch (error) {
    if (isMemoryError(error)) return { op: "done", ok: false, kind: "memory", message: describe(error) };
    return { op: "done", ok: false, kind: "serialize", message: describe(error) };
  }
  if (text === undefined) {
    return { op: "done", ok: false, kind: "serialize", message: `returned ${kindOf(value) === "function" ? "a function" : `a ${kindOf(value)}`}, which JSON cannot hold` };
  }
  const total = text.length;
  return { op: "done", ok: true, text: total > keepChars ? text.slice(0, keepChars) : text, total };
}

parentPort.on("message", (message) => {
  if (message.op === "answer") {
    const waiting = pending.get(message.id);
    if (!waiting) return;
    pending.delete(message.id);
    if ("error" in message) waiting.reject(new Error(String(message.error)));
    else waiting.resolve(message.value === undefined ? null : message.value);
  } else if (message.op === "call") {
    call(message).then(
      (done) => parentPort.postMessage(done),
      (error) => parentPort.postMessage({ op: "done", ok: false, kind: "error", message: describe(error) }),
    );
  }
});

const failed = await load();
if (mode === "register") {
  parentPort.postMessage({ op: "registry", failed, ...(failed ? {} : registry()) });
} else {
  parentPort.postMessage({ op: "ready", error: failed ? `${failed.file}${failed.line ? `:${failed.line}` : ""}: ${failed.message}` : null });
}
