// console.log/info/warn/error/debug write to the call's host.log at the
// matching level (`log` is `info`); during a source's top level, outside any
// call, they write nowhere. The console's other methods (table, dir, trace,
// time, ...) are the context's own and write nowhere.
// Part of the web globals script (see ../web.js for how the parts are joined).

{
  const log = G.host.log;
  // An argument as text: a string as it is, an Error as its stack, else JSON
  // (or String() for what JSON cannot show: undefined, functions, bigints, cycles).
  const shown = (value) => {
    if (typeof value === "string") return value;
    if (value instanceof Error && typeof value.stack === "string") return value.stack;
    try {
      const text = JSON.stringify(value);
      if (text !== undefined) return text;
    } catch {}
    try {
      return String(value);
    } catch {
      return "a value that cannot be shown";
    }
  };
  const methods = [["log", "info"], ["info", "info"], ["warn", "warn"], ["error", "error"], ["debug", "debug"]];
  const console = G.console !== null && typeof G.console === "object" ? G.console : {};
  for (const [method, level] of methods) {
    console[method] = function (...args) {
      let text = "";
      for (let i = 0; i < args.length; i++) text += (i ? " " : "") + shown(args[i]);
      let sent;
      try {
        sent = log[level](text);
      } catch {
        return; // not during a call: the host API is not available
      }
      // A plugin without the host:log permission of that level: refused, quietly.
      sent.then(undefined, () => undefined);
    };
  }
  G.console = console;
}
