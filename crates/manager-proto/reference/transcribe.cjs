// Writes a bare transcription of the package's tables as .proto text (no comments) to stdout:
// `node transcribe.cjs manager.proto` or `node transcribe.cjs shared/common.proto`. Used when
// moving to a newer package version: diff its output against proto/norsk/api (which carries our
// comments), carry the differences over, then run the published_api test.
"use strict";
const api = require("./api.cjs");

const SCALAR = {
  1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
  8: "bool", 9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64",
  17: "sint32", 18: "sint64",
};
const PACKAGE_OF = { "manager.proto": "norsk.api.manager", "shared/common.proto": "norsk.api.common" };
const IMPORT_OF = { "norsk.api.common": "norsk/api/shared/common.proto" };

const file = process.argv[2];
const entry = api.files().find((f) => f.file === file);
if (!entry) {
  console.error(`usage: node transcribe.cjs ${Object.keys(PACKAGE_OF).join("|")}`);
  process.exit(2);
}
const pkg = PACKAGE_OF[file];
const imports = new Set();

// A name as written inside `scope` (the enclosing message's full name, or the package).
function typeName(kind, T, scope = pkg) {
  if (kind === "scalar") return SCALAR[T];
  const name = T.typeName;
  if (name.startsWith(`${scope}.`)) return name.slice(scope.length + 1);
  if (name.startsWith(`${pkg}.`)) return name.slice(pkg.length + 1);
  if (name.startsWith("google.protobuf.")) imports.add(`google/protobuf/${name.slice(16).toLowerCase()}.proto`);
  const other = Object.keys(IMPORT_OF).find((p) => name.startsWith(`${p}.`) && p !== pkg);
  if (other) imports.add(IMPORT_OF[other]);
  return name;
}

// Nesting: a type whose full name extends a message's full name by one segment lives inside it.
const decls = [
  ...entry.messages.map((m) => ({ kind: "message", name: m.typeName, m })),
  ...entry.enums.map((e) => ({ kind: "enum", name: e.typeName, e })),
];
const parentOf = (name) => {
  const p = name.slice(0, name.lastIndexOf("."));
  return decls.some((d) => d.kind === "message" && d.name === p) ? p : null;
};

function render(decl, indent) {
  const pad = "  ".repeat(indent);
  const short = decl.name.slice(decl.name.lastIndexOf(".") + 1);
  if (decl.kind === "enum") {
    const values = decl.e.values.map((v) => `${pad}  ${v.name} = ${v.no};`).join("\n");
    return `${pad}enum ${short} {\n${values}\n${pad}}`;
  }
  const lines = [];
  const seenOneofs = new Set();
  const fields = decl.m.fields.list();
  for (const fi of fields) {
    if (fi.oneof) {
      if (seenOneofs.has(fi.oneof.name)) continue;
      seenOneofs.add(fi.oneof.name);
      const members = fields.filter((g) => g.oneof && g.oneof.name === fi.oneof.name);
      lines.push(`${pad}  oneof ${fi.oneof.name} {`);
      for (const g of members) lines.push(`${pad}    ${typeName(g.kind, g.T, decl.name)} ${g.name} = ${g.no};`);
      lines.push(`${pad}  }`);
      continue;
    }
    let t;
    if (fi.kind === "map") t = `map<${SCALAR[fi.K]}, ${typeName(fi.V.kind, fi.V.T, decl.name)}>`;
    else t = typeName(fi.kind, fi.T, decl.name);
    const label = fi.repeated ? "repeated " : fi.opt ? "optional " : "";
    lines.push(`${pad}  ${label}${t} ${fi.name} = ${fi.no};`);
  }
  for (const child of decls.filter((d) => parentOf(d.name) === decl.name)) lines.push(render(child, indent + 1));
  return lines.length ? `${pad}message ${short} {\n${lines.join("\n")}\n${pad}}` : `${pad}message ${short} {}`;
}

const body = decls.filter((d) => parentOf(d.name) === null).map((d) => render(d, 0));
if (file === "manager.proto") {
  const rpcs = Object.values(api.service).map((d) => {
    const name = d.path.slice(d.path.lastIndexOf("/") + 1);
    const req = (d.requestStream ? "stream " : "") + typeName("message", d.requestType);
    const resp = (d.responseStream ? "stream " : "") + typeName("message", d.responseType);
    return `  rpc ${name}(${req}) returns (${resp});`;
  });
  body.push(`service Manager {\n${rpcs.join("\n")}\n}`);
}
const head = [`syntax = "proto3";`, "", `package ${pkg};`, ""];
for (const i of [...imports].sort()) head.push(`import "${i}";`);
process.stdout.write(`${head.join("\n")}\n\n${body.join("\n\n")}\n`);
