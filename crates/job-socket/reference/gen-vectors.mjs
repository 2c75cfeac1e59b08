#!/usr/bin/env node
// Regenerates ../vectors/*.json by running the reference (the published migration-socket.js,
// @norskvideo/ctl-product-template-schema 0.1.20 with zod 4.4.3) over the input lists below.
// Every expected output in the vectors comes from here; none is written by hand.
//
//   cd crates/job-socket/reference && npm ci && node gen-vectors.mjs
import { writeFileSync, readFileSync } from "node:fs";
import { OPS } from "./ops.mjs";

const schemaPkg = JSON.parse(
  readFileSync(new URL("./node_modules/@norskvideo/ctl-product-template-schema/package.json", import.meta.url)),
);
const zodPkg = JSON.parse(readFileSync(new URL("./node_modules/zod/package.json", import.meta.url)));
const REFERENCE = `${schemaPkg.name}@${schemaPkg.version} migration-socket.js, zod@${zodPkg.version}, node ${process.version}`;

// A small deterministic PRNG so the random cases are the same on every run.
let seed = 0x9e3779b9;
function rand() {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 0x100000000;
}
const pick = (xs) => xs[Math.floor(rand() * xs.length)];

// ── JSON values used as payloads and as wrong-typed fields ───────────────────────────────
const deepArr = (d) => "[".repeat(d) + "]".repeat(d);
const deepObj = (d) => '{"a":'.repeat(d) + "1" + "}".repeat(d);
const PAYLOADS = [
  "null", "true", "false", "0", "-0", "1", "-1", "1.5", "1e21", "1e-7", "123e-20", "0.1", "100",
  "1.7976931348623157e308", "5e-324", "2e-324", "1e400", "-1e400", "12345678901234567890",
  "9007199254740993", "123456789012345680000", "0.000001", "1E+2", "-1.5E-9",
  '""', '"x"', '"\\u0000\\u001f\\b\\f\\n\\r\\t\\"\\\\\\/"', '"\\ud800"', '"\\udc00x"', '"\\ud83d\\ude00"',
  '"\\ud83d"', '"a\\ud800b\\udfff"', '"é😀\\u2028\\u2029\u007f"', '"\\u00e9"', '"\\uFEFF"',
  "[]", "{}", "[1,[2,[3]]]", '{"a":1,"a":2,"b":3}', '{"b":1,"a":2,"1":3}',
  '{"4294967294":1,"4294967295":2,"01":3,"2":4,"-1":5,"1.5":6,"0":7}',
  '{"9007199254740991":1,"4294967296":1,"b":2,"00":3,"1e3":3,"-0":3}',
  '{"__proto__":1}', '{"__proto__":{"z":1}}', '{"x":{"__proto__":[1]},"__proto__":null}',
  '{"a":{"__proto__":{"b":2},"c":3}}', '[{"__proto__":1}]', '{"__proto__":1e400}', '{"constructor":1,"toString":2}',
  '{"a":[1e400]}', "[1e400]", '{"k":-0}', '{"\\ud800":1,"\\udc00":2,"\\ud800":3}', '{"a":1,"\\u0061":2}',
  '{"\\u005f_proto__":1,"b":2}', '{"__proto__":[],"__proto__":{"a":1}}', '{"":1,"0":2," ":3}',
  "1E400", "-1e-400", "0e0", "0.0", "-0.0e-0", "1e-6", "1.5e-6", "123456789012345.678", "0.1e1", "100e-2",
  "4.35", "2.5e-323", "1e21", "999999999999999999999", "1e-22", "1e22", "1e23", "0.30000000000000004", " [ 1 , 2 ] ", "\t{\r }",
  deepArr(129), deepObj(129), deepArr(1000), deepObj(1000), deepArr(1500),
  JSON.stringify({ participants: [{ id: "video", position: 12345.678, ts: "2026-12-03T08:00:00Z" }], ok: true }),
  JSON.stringify(Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`k${i % 40}`, i]))),
];
const WRONG = ["null", "true", "1", '"s"', "[]", "{}", "1e400"];

// ── frames ─────────────────────────────────────────────────────────────────────────────
function frameCases(shapes, wrongTypes) {
  const out = [];
  for (const [type, fields] of shapes) {
    const valid = {};
    for (const [k, kind] of fields) valid[k] = kind === "payload" ? null : kind === "string" ? "v" : undefined;
    const base = (over) => {
      const parts = [`"type":${JSON.stringify(type)}`];
      for (const [k, kind] of fields) {
        if (Object.hasOwn(over, k)) {
          if (over[k] !== undefined) parts.push(`${JSON.stringify(k)}:${over[k]}`);
        } else if (kind === "payload") parts.push(`${JSON.stringify(k)}:null`);
        else if (kind === "string") parts.push(`${JSON.stringify(k)}:"v"`);
      }
      return `{${parts.join(",")}}`;
    };
    out.push(base({}));
    out.push(base({}).replace("{", '{"extra":1,"__proto__":{"x":1},') );
    out.push(base({}).replace(/}$/, ',"zzz":[1e400],"type":' + JSON.stringify(type) + "}"));
    for (const [k, kind] of fields) {
      out.push(base({ [k]: undefined }));
      for (const w of wrongTypes) out.push(base({ [k]: w }));
      if (kind === "payload") for (const p of PAYLOADS) out.push(base({ [k]: p }));
      if (kind === "string") for (const s of ['""', '"\\ud800"', '"é/😀"', '"a\\u0000b"']) out.push(base({ [k]: s }));
    }
  }
  return out;
}

const JOB_SHAPES = [
  ["hello", [["token", "string"]]],
  ["state", [["payload", "payload"]]],
  ["state-refused", [["reason", "string"]]],
  ["target-ready", [["payload", "payload"]]],
  ["source-stopped-output", [["payload", "payload"]]],
  ["target-applied", []],
  ["abort", [["reason", "string"]]],
];
const WORKER_SHAPES = [
  ["hello-ack", []],
  ["get-state", [["migrationId", "string"]]],
  ["initial-state", [["migrationId", "string"], ["payload", "payload"]]],
  ["cutover-ready", [["migrationId", "string"], ["payload", "payload"]]],
  ["cutover-apply", [["migrationId", "string"], ["payload", "payload"]]],
  ["abort", [["migrationId", "string"], ["reason", "string"]]],
];

const NOT_OBJECTS = [
  "", " ", "null", "1", '"x"', "[]", "true", "[{}]", "{", "}", "{}", '{"type":null}', '{"type":5}', '{"type":"nope"}',
  '{"type":"HELLO","token":"x"}', "\ufeff{}", '{"type":"abort","reason":"x",}', "{'type':'abort'}",
  '{"type":"abort","reason":"x"} x', '{"type":"abort","reason":"x"}\u0000', "NaN", "Infinity", "01", "1.", ".5",
  '{"type":"abort","reason":"a\tb"}', '{"type":"abort","reason":"\\x"}', '{"type":"abort","reason":"\\u12"}',
  '{"__proto__":{"type":"hello"},"token":"a"}', '{"type":"state","type":"hello","token":"t"}',
  '{"type":"hello","token":"a","__proto__":{"token":5}}', '{"type":"hello","token":"a","token":"b"}',
  '{"type":"hello","token":1,"token":"ok"}', '{"type":"hello","token":"ok","token":1}',
];

const TARGET_APPLIED = [
  '{"type":"target-applied","applied":[],"failed":[],"skewMs":0}',
  '{"type":"target-applied","applied":["a","b"],"failed":[{"id":"c","reason":"d","x":1}],"skewMs":1.5e-7}',
  '{"type":"target-applied","applied":["a",1],"failed":[{"id":1}],"skewMs":"x"}',
  '{"skewMs":"x","failed":[{"id":1}],"applied":["a",1],"type":"target-applied"}',
  '{"type":"target-applied","applied":5,"failed":5,"skewMs":"x"}',
  '{"type":"target-applied","applied":[5],"failed":[5],"skewMs":1}',
  '{"type":"target-applied","failed":[5],"applied":[true]}',
  '{"type":"target-applied","failed":[{"id":"a","reason":"b"},{"reason":7},null,[]]}',
  '{"type":"target-applied","failed":[{"id":"a","reason":"b"}],"skewMs":1e400}',
  '{"type":"target-applied","skewMs":-0}', '{"type":"target-applied","skewMs":-1e-400}',
  '{"type":"target-applied","skewMs":12345678901234567890}', '{"type":"target-applied","applied":["\\ud800"]}',
  '{"type":"target-applied","applied":null,"failed":null,"skewMs":null}',
];

const HELLO_ACK = [
  '{"type":"hello-ack","migration":{"id":"m","side":"target"}}',
  '{"type":"hello-ack","migration":{"id":"m","side":"target","x":1},"y":2}',
  '{"type":"hello-ack","migration":{"id":"m","side":"source"}}',
  '{"type":"hello-ack","migration":{"side":5}}', '{"type":"hello-ack","migration":{}}',
  '{"type":"hello-ack","migration":{"id":1,"side":"TARGET"}}', '{"type":"hello-ack","migration":[]}',
  '{"type":"hello-ack","migration":null}', '{"type":"hello-ack","migration":"m"}',
  '{"type":"cutover-apply","payload":1e999,"migrationId":3}', '{"type":"abort"}',
];

function randomFrames(types, n) {
  const keys = ["type", "token", "payload", "reason", "migrationId", "applied", "failed", "skewMs", "migration", "x"];
  const values = [...WRONG, ...PAYLOADS.slice(0, 50), ...types.map((t) => JSON.stringify(t)), '["a"]', '[{"id":"i","reason":"r"}]', '{"id":"m","side":"target"}'];
  const out = [];
  for (let i = 0; i < n; i++) {
    const parts = [`"type":${JSON.stringify(pick(types))}`];
    const count = Math.floor(rand() * 5);
    for (let j = 0; j < count; j++) parts.push(`${JSON.stringify(pick(keys))}:${pick(values)}`);
    if (rand() < 0.3) parts.reverse();
    out.push(`{${parts.join(",")}}`);
  }
  return out;
}

const JOB_TYPES = JOB_SHAPES.map(([t]) => t);
const WORKER_TYPES = WORKER_SHAPES.map(([t]) => t);
const frameJob = [...frameCases(JOB_SHAPES, WRONG), ...NOT_OBJECTS, ...TARGET_APPLIED, ...HELLO_ACK, ...randomFrames(JOB_TYPES, 300)];
const frameWorker = [...frameCases(WORKER_SHAPES, WRONG), ...NOT_OBJECTS, ...TARGET_APPLIED, ...HELLO_ACK, ...randomFrames(WORKER_TYPES, 300)];

// ── paths ──────────────────────────────────────────────────────────────────────────────
const PATHS = [
  "/instances/a/b", "/instances/a/b/", "/instances/a/b//", "/instances/a/b/c", "/instances//b", "/instances/a/",
  "/instances/a//", "/instances/a", "/instances/", "/instances", "instances/a/b", "//instances/a/b", "/Instances/a/b",
  "/instances/a/b?x=1", "/instances/a/b/?x=1", "/instances/a/b#frag", "/instances/a/b/#f?g", "/instances/a/b?",
  "/instances/a/b#", "/instances/a/b?x=1/2#3", "/instances/a?/b", "/instances/a#/b", "/instances/a/b?x\ry",
  "/instances/a/b?x\u2028y", "/instances/a/b?x\u2029", "/instances/a\rb/c", "/instances/a\u2028b/c",
  "/instances/a%2fb/c", "/instances/a%2Fb/c%2F", "/instances/a+b/c+d", "/instances/a%20b/c%2Bd", "/instances/a b/c d",
  "/instances/%FF/b", "/instances/a/%ff", "/instances/%/b", "/instances/%2/b", "/instances/%zz/b", "/instances/a/b%",
  "/instances/%C3%A9/b", "/instances/%c3%a9/b", "/instances/%C3/b", "/instances/%C3%28/b", "/instances/%E2%82%AC/r",
  "/instances/%F0%9F%98%80/r", "/instances/%ED%A0%80/r", "/instances/%C0%AF/r", "/instances/%F4%90%80%80/r",
  "/instances/%E2%82/r", "/instances/%80/r", "/instances/é/😀", "/instances/%3F/%23", "/instances/%00/r",
  "/instances/job-1/migrationTarget", "/instances/job.1_~!*'()/role", "/instances/a/b/?", "/instances/a/b/c?x",
  "", "/", "/instances/a/b ", " /instances/a/b", "/instances/%25/%2525", "/instances/..%2F../x",
];
for (const [j, r] of [["a/b", "c d"], ["é😀", "+%"], ["job?#", "role/"], ["~!*'()", "-_."], ["\u0000\u007f", "\u2028"]]) {
  PATHS.push(`/instances/${encodeURIComponent(j)}/${encodeURIComponent(r)}`);
}

// ── payload codec ──────────────────────────────────────────────────────────────────────
const ENCODE = ["", ...PAYLOADS, "not json", "[1,]", "{\"a\":}"];
const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const te = (s) => [...new TextEncoder().encode(s)];
const DECODE = [
  "", "not base64!", "abc", "QQ", "QR==",
  b64(te("null")), b64(te("[1,2]")), b64(te('{"b":1,"1":2,"__proto__":3}')), b64(te("1e400")),
  b64(te("12345678901234567890")), b64(te('"\\ud800"')), b64(te("not json")), b64(te(" ")), b64(te("\ufeff[1]")),
  b64(te("\ufeff\ufeff[1]")), b64(te("\ufeff")), b64(te("[1]\ufeff")), b64(te("{\"a\":1,\"a\":2}")),
  b64([0xff]), b64([0x61, 0xff, 0x62]), b64([0xc3]), b64([0xc3, 0x28]), b64([0xe2, 0x82]), b64([0xe2, 0x82, 0x28]),
  b64([0xf0, 0x9f, 0x98]), b64([0xed, 0xa0, 0x80]), b64([0xc0, 0xaf]), b64([0xf4, 0x90, 0x80, 0x80]),
  b64([0x22, 0xff, 0x22]), b64([0x5b, 0x22, 0x80, 0x22, 0x5d]), b64([0xef, 0xbb]), b64([0xef, 0xbb, 0xbf, 0xff]),
  b64([0xfe, 0xff, 0x00, 0x31]), b64([0x00]), b64(te(deepArr(1000))), b64(te(deepObj(1000))),
  ...PAYLOADS.map((p) => b64(te(p))),
];

// ── write ──────────────────────────────────────────────────────────────────────────────
function write(file, command, inputs) {
  const seen = new Set();
  const cases = [];
  for (const input of inputs) {
    if (seen.has(input)) continue;
    seen.add(input);
    if (input.includes("\n") || !input.isWellFormed()) throw new Error(`input cannot ride a UTF-8 line: ${JSON.stringify(input)}`);
    cases.push({ input, output: OPS[command](input) });
  }
  const doc = { command: command.split(" "), reference: REFERENCE, generator: "reference/gen-vectors.mjs", cases };
  writeFileSync(new URL(`../vectors/${file}`, import.meta.url), JSON.stringify(doc, null, 1) + "\n");
  console.log(`${file}: ${cases.length} cases`);
}

write("parse-frame-job.json", "parse-frame --from job", frameJob);
write("parse-frame-worker.json", "parse-frame --from worker", frameWorker);
write("parse-path.json", "parse-path", PATHS);
write("encode-payload.json", "encode-payload", ENCODE);
write("decode-payload.json", "decode-payload", DECODE);
