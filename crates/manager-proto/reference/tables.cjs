// Prints the package's own tables as JSON: every message's fields (number, name, kind, type,
// repeated, oneof, proto3 optional, map key and value), every enum's values, and the Manager
// service's RPCs (path, request, response, streaming flags). tests/published_api.rs compares
// this with the descriptors of proto/norsk/api, compiled by protox.
"use strict";
const api = require("./api.cjs");

const typeOf = (kind, T) => (kind === "scalar" ? T : T.typeName);

function field(fi) {
  const out = {
    no: fi.no,
    name: fi.name,
    kind: fi.kind,
    repeated: Boolean(fi.repeated),
    oneof: fi.oneof ? fi.oneof.name : null,
    optional: Boolean(fi.opt),
  };
  if (fi.kind === "map") {
    out.type = null;
    out.map = { key: fi.K, value_kind: fi.V.kind, value_type: typeOf(fi.V.kind, fi.V.T) };
  } else {
    out.type = typeOf(fi.kind, fi.T);
    out.map = null;
  }
  return out;
}

const messages = {};
const enums = {};
for (const f of api.files()) {
  for (const m of f.messages) messages[m.typeName] = { file: f.file, fields: m.fields.list().map(field) };
  for (const e of f.enums) enums[e.typeName] = { values: e.values.map((v) => [v.no, v.name]) };
}
const rpcs = Object.values(api.service).map((d) => ({
  path: d.path,
  request: d.requestType.typeName,
  response: d.responseType.typeName,
  client_streaming: d.requestStream,
  server_streaming: d.responseStream,
}));
process.stdout.write(JSON.stringify({ package: api.PACKAGE, messages, enums, rpcs }, null, 1) + "\n");
