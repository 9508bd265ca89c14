#!/usr/bin/env node
// A jevany-daemon client in Node.js, and a check of the daemon's replies against docs/PROTOCOL.md.
//
//   cd examples/node && npm ci && node client.js ipc:///run/user/1000/jevany/daemon.sock
//
// One DEALER socket, msgpack maps, replies matched by id. Sends decide, ping,
// status, a pipelined burst of decide requests, and requests that must fail
// (bytes that are not msgpack, an unknown op, NaN in the state, an id that is
// a float); checks every reply's shape; prints each mismatch and exits 1 if
// there was any, 2 if the daemon did not answer in time.
"use strict";

const zmq = require("zeromq");
const { encode, decode } = require("@msgpack/msgpack");

const TIMEOUT_MS = Number(process.env.JEVANY_NODE_TIMEOUT_MS || 60000);
const RETRYABLE = {
  invalid_message: false, unsupported_version: false, unknown_op: false, forbidden: false,
  invalid_request: false, unknown_model: false, context_length_exceeded: false,
  unsupported_media: false, overloaded: true, deadline_exceeded: true, shutting_down: true,
  worker_lost: true, internal: false,
};

const BODY = {
  state: { ticket: "parcel two weeks late", tier: "gold", attempts: 2, ratio: 2.5 },
  questions: {
    action: { type: "choice", criteria: { refund: null, resend: "ship it again", escalate: null } },
    urgent: { type: "noul", instructions: "Is this urgent?" },
    severity: { type: "score", criteria: ["low", "medium", "high"] },
  },
};

let checks = 0;
const mismatches = [];

function check(ok, what) {
  checks += 1;
  if (!ok) mismatches.push(what);
}

const isInt = (x) => Number.isInteger(x);
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const isStr = (x) => typeof x === "string";
const isMap = (x) => x !== null && typeof x === "object" && !Array.isArray(x) && !(x instanceof Uint8Array);
const sameKeys = (obj, keys) => isMap(obj) && JSON.stringify(Object.keys(obj).sort()) === JSON.stringify([...keys].sort());
const sum = (obj) => Object.values(obj).reduce((a, b) => a + b, 0);

class Connection {
  constructor(endpoint) {
    this.sock = new zmq.Dealer({ linger: 0, receiveTimeout: TIMEOUT_MS });
    this.sock.connect(endpoint);
  }

  async send(message) {
    await this.sock.send(message instanceof Uint8Array ? message : encode(message));
  }

  async receive() {
    const [frame] = await this.sock.receive();
    return decode(frame);
  }

  async call(message) {
    await this.send(message);
    return this.receive();
  }

  close() {
    this.sock.close();
  }
}

function checkEnvelope(reply, id, what) {
  check(isMap(reply), `${what}: the reply is a map`);
  check(reply.v === 1, `${what}: v is 1 (got ${reply.v})`);
  check(reply.id === id, `${what}: id ${JSON.stringify(id)} echoed (got ${JSON.stringify(reply.id)})`);
  check(typeof reply.ok === "boolean", `${what}: ok is a bool`);
}

function checkOk(reply, id, what) {
  checkEnvelope(reply, id, what);
  check(reply.ok === true && isMap(reply.result), `${what}: ok with a result map (got ${JSON.stringify(reply.error)})`);
  return reply.ok === true ? reply.result : {};
}

function checkError(reply, id, code, what) {
  checkEnvelope(reply, id, what);
  check(reply.ok === false && !("result" in reply), `${what}: ok is false, no result`);
  const error = reply.error || {};
  check(error.code === code, `${what}: error code ${code} (got ${error.code})`);
  check(isStr(error.message) && error.message.length > 0, `${what}: a message for people`);
  check(error.retryable === RETRYABLE[code], `${what}: retryable is ${RETRYABLE[code]}`);
}

function checkProbabilities(probs, keys, what) {
  check(sameKeys(probs, keys), `${what}: probabilities keyed ${keys}`);
  if (isMap(probs)) {
    check(Object.values(probs).every((p) => isNum(p) && p >= 0 && p <= 1), `${what}: probabilities in [0, 1]`);
    check(Math.abs(sum(probs) - 1) <= 1e-6, `${what}: probabilities sum to 1 (got ${sum(probs)})`);
  }
}

function checkDecideResult(result, what) {
  check(isStr(result.model), `${what}: model is a str`);
  check(sameKeys(result.answers, Object.keys(BODY.questions)), `${what}: an answer per question`);
  const answers = result.answers || {};
  const action = answers.action || {};
  check(action.type === "choice", `${what}: action is a choice answer`);
  check(["refund", "resend", "escalate"].includes(action.choice), `${what}: choice is an option key`);
  checkProbabilities(action.probabilities, ["refund", "resend", "escalate"], `${what}: action`);
  check(isNum(action.confidence), `${what}: choice confidence`);
  const urgent = answers.urgent || {};
  check(urgent.type === "noul" && isNum(urgent.noul), `${what}: noul answer`);
  checkProbabilities(urgent.probabilities, ["false", "true"], `${what}: urgent`);
  const severity = answers.severity || {};
  check(severity.type === "score" && isNum(severity.score), `${what}: score answer`);
  check(JSON.stringify(severity.legend) === JSON.stringify({ 0: "low", 1: "medium", 2: "high" }),
    `${what}: score legend maps levels to the criteria`);
  checkProbabilities(severity.probabilities, ["0", "1", "2"], `${what}: severity`);
  check(isNum(severity.confidence), `${what}: score confidence`);
  const usage = result.usage || {};
  check(isInt(usage.input_tokens) && isInt(usage.output_tokens), `${what}: usage token counts`);
  check(isNum(result.latency_ms), `${what}: latency_ms`);
  check(isMap(result.batch) && isInt(result.batch.size) && isInt(result.batch.padded_tokens), `${what}: batch facts`);
}

function checkStatus(s) {
  check(isStr(s.version) && isInt(s.pid) && isNum(s.uptime_s), "status: version, pid, uptime_s");
  check(s.state === "ready", `status: state ready (got ${s.state})`);
  check(Array.isArray(s.endpoints) && s.endpoints.every(isStr), "status: endpoints");
  check(isInt(s.max_message_bytes), "status: max_message_bytes");
  check(isMap(s.model) && ["id", "source", "readout", "layout", "device", "dtype"].every((k) => k in s.model),
    "status: model fields");
  const b = s.batching || {};
  check(isInt(b.max_batch_size) && isInt(b.batches) && isNum(b.mean_batch_size) && isMap(b.batch_size_histogram),
    "status: batching");
  check(isMap(s.queue) && isInt(s.queue.depth) && isInt(s.queue.max_depth), "status: queue");
  check(Array.isArray(s.workers) && s.workers.length > 0 && s.workers.every((w) => isInt(w.pid) && isStr(w.state)),
    "status: workers");
  check(isMap(s.requests) && isInt(s.requests.ok) && isInt(s.requests.error) && isMap(s.requests.by_error_code),
    "status: request counts");
  check(isMap(s.latency_ms) && isNum(s.latency_ms.p50) && isNum(s.latency_ms.p99), "status: latency percentiles");
}

async function pipelined(conn, n) {
  const ids = Array.from({ length: n }, (_, i) => `node-burst-${i}`);
  for (const id of ids) await conn.send({ v: 1, id, op: "decide", body: BODY });
  const seen = new Map();
  for (let i = 0; i < n; i += 1) {
    const reply = await conn.receive();
    check(ids.includes(reply.id) && !seen.has(reply.id), `burst: reply for an id in flight, once (${reply.id})`);
    seen.set(reply.id, reply);
  }
  const first = seen.get(ids[0]);
  for (const id of ids) {
    const result = checkOk(seen.get(id) || {}, id, `burst ${id}`);
    checkDecideResult(result, `burst ${id}`);
    if (first && first.ok && result.answers) {
      // The same request, batched with others, gets the same answer (within the FP32 parity bound).
      const a = first.result.answers.action.probabilities;
      const b = result.answers.action.probabilities;
      check(Object.keys(a).every((k) => Math.abs(a[k] - b[k]) <= 1e-5), `burst ${id}: same answer as ${ids[0]}`);
    }
  }
}

async function main() {
  const endpoint = process.argv[2] || process.env.JEVANY_ENDPOINT;
  if (!endpoint) {
    console.error("usage: node client.js ENDPOINT   (or set JEVANY_ENDPOINT)");
    return 2;
  }
  const conn = new Connection(endpoint);
  try {
    checkDecideResult(checkOk(await conn.call({ v: 1, id: "node-1", op: "decide", body: BODY }), "node-1", "decide"),
      "decide");
    const pong = checkOk(await conn.call({ v: 1, id: 42, op: "ping" }), 42, "ping with an integer id");
    check(pong.pong === true && isStr(pong.version), "ping: pong and version");
    checkStatus(checkOk(await conn.call({ v: 1, id: "node-status", op: "status" }), "node-status", "status"));
    await pipelined(conn, 8);

    checkError(await conn.call(new Uint8Array([0xc1, 0x00, 0xff])), null, "invalid_message", "bytes that are not msgpack");
    checkError(await conn.call({ v: 1, id: 1.5, op: "ping" }), null, "invalid_message", "a float id");
    checkError(await conn.call({ v: 1, id: "node-op", op: "explode" }), "node-op", "unknown_op", "an unknown op");
    checkError(await conn.call({ v: 2, id: "node-v2", op: "ping" }), "node-v2", "unsupported_version", "v 2");
    checkError(await conn.call({ v: 1, id: "node-nan", op: "decide", body: { ...BODY, state: { x: NaN } } }),
      "node-nan", "invalid_request", "NaN in the state");
    checkError(await conn.call({ v: 1, id: "node-drain", op: "drain" }), "node-drain", "forbidden",
      "a control op on the public endpoint");
    // Still serving after all of that.
    checkOk(await conn.call({ v: 1, id: "node-last", op: "ping" }), "node-last", "ping afterwards");
  } catch (err) {
    console.error(`no reply from ${endpoint} within ${TIMEOUT_MS} ms, or the socket failed: ${err.message}`);
    return 2;
  } finally {
    conn.close();
  }
  for (const what of mismatches) console.error(`MISMATCH ${what}`);
  console.log(`node client: ${checks} checks, ${mismatches.length} mismatches`);
  return mismatches.length ? 1 : 0;
}

main().then((code) => process.exit(code));
