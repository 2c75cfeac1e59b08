// Filled samples of every published message, encoded by the package's own classes, and the
// check of what our generated code made of them.
//
//   node samples.cjs generate   prints [{type, sample, bytes}]: for each message, one sample
//                               with every field set (the first member of each oneof) and one
//                               more per further oneof member; bytes are base64.
//   node samples.cjs verify     reads [{type, sample, bytes, ours}] on stdin (ours: our
//                               re-encoding, base64), decodes ours with the package's class,
//                               and prints the samples where it differs from the original or
//                               re-encodes to other bytes; exits 1 if any.
"use strict";
const { protoInt64 } = require("@bufbuild/protobuf");
const api = require("./api.cjs");

const DEPTH = 3;

function scalar(T, salt) {
  switch (T) {
    case 1: return 1.5 + salt; // double
    case 2: return 2.5; // float: exactly representable
    case 3: case 16: case 18: return protoInt64.parse(`-${9007199254740993n + BigInt(salt)}`); // int64, sfixed64, sint64
    case 4: case 6: return protoInt64.uParse(`${18446744073709551610n - BigInt(salt)}`); // uint64, fixed64
    case 5: case 15: case 17: return -70000 - salt; // int32, sfixed32, sint32
    case 7: case 13: return 4000000000 + salt; // fixed32, uint32
    case 8: return true;
    case 9: return `s${salt}-é`;
    case 12: return new Uint8Array([0, 1, 254, salt & 255]);
    default: throw new Error(`scalar type ${T}`);
  }
}

function value(kind, T, depth, salt) {
  if (kind === "scalar") return scalar(T, salt);
  if (kind === "enum") {
    const values = T.values;
    return values[values.length - 1].no;
  }
  return fill(T, depth + 1, salt, 0);
}

// `variant`: which member of each oneof to set (the k-th, or the last one when there are fewer).
function fill(Class, depth, salt, variant) {
  const msg = new Class();
  // A Timestamp in its valid range, so the JSON form used in the check exists.
  if (Class.typeName === "google.protobuf.Timestamp") {
    msg.seconds = protoInt64.parse(1733000000 + salt);
    msg.nanos = 123000000 + salt;
    return msg;
  }
  if (depth > DEPTH) return msg;
  const fields = Class.fields.list();
  const oneofs = new Map();
  for (const f of fields) if (f.oneof) oneofs.set(f.oneof.name, (oneofs.get(f.oneof.name) || []).concat([f]));
  for (const f of fields) {
    const s = salt + f.no;
    if (f.oneof) {
      const members = oneofs.get(f.oneof.name);
      if (members[Math.min(variant, members.length - 1)] !== f) continue;
      msg[f.oneof.localName] = { case: f.localName, value: value(f.kind, f.T, depth, s) };
    } else if (f.kind === "map") {
      // Keys in ascending order, as our generated code (BTreeMap) writes them.
      const keys = f.K === 9 ? ["a", "b"] : f.K === 8 ? [false, true] : [1, 2];
      const m = {};
      for (const k of keys) m[String(k)] = value(f.V.kind, f.V.T, depth, s);
      msg[f.localName] = m;
    } else if (f.repeated) {
      msg[f.localName] = [value(f.kind, f.T, depth, s), value(f.kind, f.T, depth, s + 1)];
    } else {
      msg[f.localName] = value(f.kind, f.T, depth, s);
    }
  }
  return msg;
}

function variantsOf(Class) {
  const counts = new Map();
  for (const f of Class.fields.list()) if (f.oneof) counts.set(f.oneof.name, (counts.get(f.oneof.name) || 0) + 1);
  return Math.max(1, ...counts.values());
}

const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const unb64 = (s) => new Uint8Array(Buffer.from(s, "base64"));

function generate() {
  const out = [];
  for (const [type, Class] of api.messageClasses()) {
    for (let v = 0; v < variantsOf(Class); v++) out.push({ type, sample: v, bytes: b64(fill(Class, 0, 0, v).toBinary()) });
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

function verify(input) {
  const classes = api.messageClasses();
  const bad = [];
  for (const s of JSON.parse(input)) {
    const Class = classes.get(s.type);
    if (!Class) {
      bad.push(`${s.type}: not a message of the package`);
      continue;
    }
    const original = Class.fromBinary(unb64(s.bytes));
    let theirs;
    try {
      theirs = Class.fromBinary(unb64(s.ours));
    } catch (e) {
      bad.push(`${s.type} sample ${s.sample}: the package cannot decode our bytes: ${e.message}`);
      continue;
    }
    // Compared as JSON: the package's runtime (0.3.0) reports two equal messages with a scalar
    // oneof member as unequal.
    if (original.toJsonString() !== theirs.toJsonString()) bad.push(`${s.type} sample ${s.sample}: decodes to another value`);
    else if (b64(theirs.toBinary()) !== s.bytes) bad.push(`${s.type} sample ${s.sample}: re-encodes to other bytes`);
  }
  process.stdout.write(bad.map((l) => `${l}\n`).join(""));
  process.exit(bad.length ? 1 : 0);
}

const cmd = process.argv[2];
if (cmd === "generate") generate();
else if (cmd === "verify") {
  let input = "";
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (d) => (input += d));
  process.stdin.on("end", () => verify(input));
} else {
  console.error("usage: node samples.cjs generate|verify");
  process.exit(2);
}
