// The main thread of one confined runtime process (one per plugin slot).
//
// It runs no plugin code itself. Plugin code runs in a worker thread (an
// isolate with resourceLimits), in one of two ways:
// - every source a script (the usual case): one long-lived isolate
//   (contexts.mjs) runs each call in a fresh vm context of its own; the isolate
//   is replaced only when a call hits a limit, breaks it, or leaves it holding
//   much memory;
// - a source that is an ES module: each call gets a fresh isolate (isolate.mjs),
//   started BEFORE the call arrives (its sources already evaluated), used for
//   exactly one call and terminated after it; the next one starts as soon as a
//   call begins.
//
// Protocol, one JSON object per line: stdin from the worker process, stdout to it.
//   in:  {op: "call", callId, key, input, context, timeoutMs, keepChars}
//        {op: "answer", callId, id, value} | {op: "answer", callId, id, error}
//   out: {op: "host", id, chain, args}    (args: the JSON text of the call's arguments)
//        {op: "done", ok: true, text, total} | {op: "done", ok: false, kind, message}
//        {op: "registry", ...}              (register mode, then the process exits)
//        {op: "probe", vmDataKb}            (probe mode, then the process exits)
// kind: "error" | "serialize" | "timeout" | "memory" | "load".
import { Worker } from "node:worker_threads";
import { readFileSync } from "node:fs";
import { stripTypeScriptTypes } from "node:module";
import { createInterface } from "node:readline";
import vm from "node:vm";

const config = JSON.parse(process.argv[2]);
const { mode, root, sources, heapMb, registerTimeoutMs } = config;

// Each source, prepared once for every isolate: a CommonJS-style source (no
// import/export, what Node itself runs a .ts or .js file without them as) is
// type-stripped and checked to compile HERE, so an isolate only compiles
// plain JavaScript (stripping TypeScript in every isolate doubled its start).
// Anything else (an .mjs, ESM syntax, a syntax or TypeScript error) is
// imported by the isolate as Node would, which also gives Node's own error.
function prepare(source) {
  if (source.endsWith(".mjs")) return { source, kind: "import" };
  const filename = `${root}/${source}`;
  try {
    const text = readFileSync(filename, "utf8");
    const code = source.endsWith(".ts") ? stripTypeScriptTypes(text, { mode: "strip" }) : text;
    vm.compileFunction(code, ["exports", "require", "module", "__filename", "__dirname"], { filename });
    return { source, kind: "cjs", code };
  } catch {
    return { source, kind: "import" };
  }
}
const prepared = mode === "probe" ? [] : sources.map(prepare);
const inContexts = prepared.every((p) => p.kind === "cjs");
const script = inContexts ? "./contexts.mjs" : "./isolate.mjs";

function send(message) {
  process.stdout.write(`${JSON.stringify(message)}\n`);
}

function start() {
  const worker = new Worker(new URL(script, import.meta.url), {
    workerData: { mode: mode === "probe" ? "register" : mode, root, sources: prepared, heapMb },
    resourceLimits: {
      // The call's heap; ArrayBuffers and everything else are bounded by the
      // process's RLIMIT_DATA (set by the worker, see workers/plugin/process.py).
      maxOldGenerationSizeMb: heapMb,
      maxYoungGenerationSizeMb: Math.min(16, Math.max(2, Math.floor(heapMb / 8))),
      // 16 MB of JIT code is plenty for a handler; V8's default reserves 512 MB.
      codeRangeSizeMb: 16,
      stackSizeMb: 4,
    },
    // An ES module isolate's console output goes nowhere (host.log is the way to log;
    // in a vm context, console writes go to host.log: web/console.js);
    // it must never reach this process's stdout, the protocol.
    stdout: true,
    stderr: true,
    env: {},
    argv: [],
    // No execArgv here: an explicit one (even []) drops the parent's
    // --permission flags, and the isolate would run without the permission model.
  });
  worker.stdout.resume();
  worker.stderr.resume();
  const isolate = { worker, ready: null, call: null, ended: false };
  isolate.ready = new Promise((resolve) => {
    isolate.markReady = resolve;
  });
  worker.on("message", (message) => onMessage(isolate, message));
  worker.on("error", (error) => onEnd(isolate, error));
  worker.on("exit", (code) => onEnd(isolate, null, code));
  return isolate;
}

let warm = null;
let current = null;
let probed = 0;

function finish(isolate, done) {
  if (isolate.call === null) return;
  // Tagged here, by the main thread: a late or stray line never ends another call.
  done.callId = isolate.call.callId;
  clearTimeout(isolate.call.timer);
  isolate.call = null;
  current = null;
  const keep = inContexts && !isolate.ended && done.recycle !== true && done.kind !== "timeout" && done.kind !== "memory";
  delete done.recycle;
  send(done);
  if (keep) return;
  isolate.ended = true;
  isolate.worker.terminate().catch(() => {});
  if (inContexts && warm === isolate) warm = start();
}

function onMessage(isolate, message) {
  switch (message.op) {
    case "ready":
      isolate.loadError = message.error;
      isolate.markReady();
      break;
    case "host":
      if (isolate.call !== null) {
        process.stdout.write(`{"op":"host","id":${Number(message.id)},"chain":${JSON.stringify(String(message.chain))},"args":${message.args}}\n`);
      }
      break;
    case "done":
      finish(isolate, message);
      break;
    case "registry":
      if (mode === "probe" && ++probed < 2) break;
      if (mode === "probe") {
        // How much the process holds with one isolate up: the worker adds the
        // call's memory limit to this for its RLIMIT_DATA.
        const found = readFileSync("/proc/self/status", "utf8").match(/VmData:\s+(\d+) kB/);
        send({ op: "probe", vmDataKb: found ? Number(found[1]) : null });
      } else {
        send({ op: "registry", ...message });
      }
      process.exit(0);
      break;
    default:
      break;
  }
}

function onEnd(isolate, error, code) {
  if (mode !== "serve") {
    const out = mode === "probe" ? "probe" : "registry";
    if (error && error.code === "ERR_WORKER_OUT_OF_MEMORY") send({ op: out, failed: { kind: "memory", message: String(error.message) } });
    else send({ op: out, failed: { kind: "error", message: error ? String(error.message) : `the isolate exited (${code})` } });
    process.exit(0);
  }
  if (isolate.call !== null) {
    if (error && error.code === "ERR_WORKER_OUT_OF_MEMORY") finish(isolate, { op: "done", ok: false, kind: "memory", message: String(error.message) });
    else if (error) finish(isolate, { op: "done", ok: false, kind: "error", message: error instanceof Error ? String(error.message) : String(error) });
    else finish(isolate, { op: "done", ok: false, kind: "error", message: `the handler ended its runtime (exit code ${code})` });
  } else if (inContexts && warm === isolate && !isolate.ended) {
    // The long-lived isolate ended between calls: the next call gets a new one.
    isolate.ended = true;
    warm = start();
  } else if (!isolate.ended) {
    // Died while waiting (its sources threw asynchronously, say): the call that
    // takes it fails with why; no restart loop (the next call starts a new one).
    isolate.ended = true;
    const why = error && error.code === "ERR_WORKER_OUT_OF_MEMORY" ? "ran out of memory" : error ? String(error.message) : `exited (${code})`;
    if (!isolate.loadError) isolate.loadError = `the sources failed after loading: ${why}`;
    isolate.markReady();
  }
}

async function onCall(message) {
  const isolate = warm;
  // A fresh isolate per call: the next call's starts now, while this one runs
  // (the probe counts two isolates for the process's memory limit).
  if (!inContexts) warm = start();
  const call = { callId: message.callId, timer: null };
  current = { isolate, callId: message.callId };
  isolate.call = call;
  // The time limit counts from the call's arrival, a warm-up still under way included.
  call.timer = setTimeout(() => {
    finish(isolate, { op: "done", ok: false, kind: "timeout", message: "timed out" });
  }, message.timeoutMs);
  await isolate.ready;
  if (isolate.call !== call) return;
  if (isolate.loadError) {
    finish(isolate, { op: "done", ok: false, kind: "load", message: isolate.loadError });
    return;
  }
  isolate.worker.postMessage({
    op: "call",
    key: message.key,
    input: message.input,
    context: message.context,
    keepChars: message.keepChars,
  });
}

if (mode === "probe" || mode === "register") {
  start();
  if (mode === "probe") start();
  setTimeout(() => {
    send({ op: "registry", failed: { kind: "timeout", message: "timed out" } });
    process.exit(0);
  }, registerTimeoutMs ?? 10000).unref();
} else {
  warm = start();
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  lines.on("line", (line) => {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return;
    }
    if (message.op === "call" && current === null && warm !== null) {
      onCall(message);
    } else if (message.op === "answer" && current !== null && message.callId === current.callId) {
      const answer = "error" in message ? { op: "answer", id: message.id, error: String(message.error) } : { op: "answer", id: message.id, value: message.value };
      current.isolate.worker.postMessage(answer);
    }
  });
  lines.on("close", () => process.exit(0));
}
