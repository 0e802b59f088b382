// The raw baseline of a plugin call: what one writes by hand to run a handler
// confined, a fresh `bwrap ... node handler.js` per call (bench/baselines.py).
// It registers the bench's trivial tool the way a plugin source does and runs
// its handler once with the input from argv, printing the result as JSON.
globalThis.tools = {};
globalThis.tools.one = {
  description: "Returns 1.",
  handler: () => 1,
};
const input = JSON.parse(process.argv[2] || "{}");
Promise.resolve(globalThis.tools.one.handler(input, Object.freeze({ callId: "raw" }))).then(
  (value) => process.stdout.write(JSON.stringify(value === undefined ? null : value)),
  (error) => {
    process.stdout.write(JSON.stringify({ error: String(error) }));
    process.exitCode = 1;
  },
);
