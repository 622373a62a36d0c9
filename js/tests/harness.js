// A minimal in-page test runner: tests run one after the other, each with a
// time limit; the results land in window.testResults for the driver
// (run.py) to read, and in the page for a person to look at.

const tests = [];

/** Registers a test: `fn` is async and throws to fail. */
export function test(name, fn, { timeoutMs = 120_000 } = {}) {
  tests.push({ name, fn, timeoutMs });
}

export class AssertionError extends Error {
  constructor(message) {
    super(message);
    this.name = "AssertionError";
  }
}

export function assert(condition, message) {
  if (!condition) throw new AssertionError(message);
}

export function assertEqual(actual, expected, what) {
  const a = JSON.stringify(actual), e = JSON.stringify(expected);
  if (a !== e) throw new AssertionError(`${what}: got ${a}, want ${e}`);
}

/** |actual[i] - expected[i]| <= tol(expected[i]) for every i; returns the largest error. */
export function assertAllClose(actual, expected, tol, what) {
  assertEqual(actual.length, expected.length, `${what}: length`);
  let worst = 0;
  for (let i = 0; i < expected.length; i++) {
    const err = Math.abs(actual[i] - expected[i]);
    const limit = typeof tol === "function" ? tol(expected[i]) : tol;
    if (!(err <= limit)) {
      throw new AssertionError(`${what}: element ${i} is ${actual[i]}, want ${expected[i]} (error ${err} > ${limit})`);
    }
    worst = Math.max(worst, err);
  }
  return worst;
}

/** Awaits `promiseOrFn` and checks that it rejects (or throws) a GradclipError with `code`. */
export async function assertRejects(promiseOrFn, code, ErrorClass, what) {
  let error = null;
  try {
    await (typeof promiseOrFn === "function" ? promiseOrFn() : promiseOrFn);
  } catch (e) {
    error = e;
  }
  assert(error !== null, `${what}: did not fail (want ${code})`);
  assert(error instanceof ErrorClass, `${what}: threw ${error?.name} ${error}, not a ${ErrorClass.name}`);
  assertEqual(error.code, code, `${what}: code (message: ${error.message})`);
  assert(typeof error.message === "string" && error.message.length > 0, `${what}: empty message`);
  return error;
}

/** Runs every registered test; publishes window.testResults. */
export async function run() {
  const results = (window.testResults = { done: false, results: [], log: [] });
  const list = document.getElementById("results");
  for (const t of tests) {
    const t0 = performance.now();
    let error = null;
    try {
      await Promise.race([
        t.fn((line) => results.log.push(`${t.name}: ${line}`)),
        new Promise((_, reject) => setTimeout(() => reject(new AssertionError(`timed out after ${t.timeoutMs} ms`)), t.timeoutMs)),
      ]);
    } catch (e) {
      error = `${e?.name ?? "Error"}: ${e?.message ?? e}${e?.code ? ` [code ${e.code}]` : ""}`;
    }
    const r = { name: t.name, ok: error === null, ms: Math.round(performance.now() - t0), error };
    results.results.push(r);
    const li = document.createElement("li");
    li.textContent = `${r.ok ? "ok  " : "FAIL"} ${r.name} (${r.ms} ms)${r.error ? ": " + r.error : ""}`;
    li.style.color = r.ok ? "#1a7f37" : "#b00020";
    list.appendChild(li);
  }
  results.done = true;
}
