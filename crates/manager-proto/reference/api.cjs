// The package's own generated code, loaded once: every message class and enum of the two files
// the Manager service uses, and the grpc-js service definition.
"use strict";
const { proto3 } = require("@bufbuild/protobuf");

const PACKAGE = "@norskvideo/norsk-api";
const FILES = {
  "manager.proto": require(`${PACKAGE}/lib/manager_pb.js`),
  "shared/common.proto": require(`${PACKAGE}/lib/shared/common_pb.js`),
};
const grpc = require(`${PACKAGE}/lib/manager_grpc_pb.js`);

function isMessageClass(v) {
  return typeof v === "function" && typeof v.typeName === "string" && v.fields !== undefined;
}

function enumTypeOf(v) {
  if (typeof v !== "object" || v === null) return undefined;
  try {
    return proto3.getEnumType(v);
  } catch {
    return undefined;
  }
}

/** { file, messages: [class], enums: [EnumType] } for each file, in the package's export order. */
function files() {
  return Object.entries(FILES).map(([file, mod]) => ({
    file,
    messages: Object.values(mod).filter(isMessageClass),
    enums: Object.values(mod).map(enumTypeOf).filter((e) => e !== undefined),
  }));
}

/** Every message class by its full name. */
function messageClasses() {
  const out = new Map();
  for (const f of files()) for (const m of f.messages) out.set(m.typeName, m);
  return out;
}

module.exports = { PACKAGE, files, messageClasses, service: grpc.ManagerService, ManagerClient: grpc.ManagerClient };
