// The conformance line protocol over the reference (the published migration-socket.js).
// One input line in, one JSON line out — the same protocol as `cargo run -p job-socket --bin job-socket`.
import {
  decodeMigrationPayload,
  encodeMigrationPayload,
  parseJobSocketPath,
  parseJobToWorkerFrame,
  parseWorkerToJobFrame,
} from "@norskvideo/ctl-product-template-schema/migration-socket";

// Canonical padded base64 (Buffer.from itself accepts almost anything, so the shape is checked first).
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

export const OPS = {
  "parse-frame --from job": (line) => JSON.stringify(parseJobToWorkerFrame(line)),
  "parse-frame --from worker": (line) => JSON.stringify(parseWorkerToJobFrame(line)),
  "parse-path": (line) => JSON.stringify(parseJobSocketPath(line) ?? null),
  "encode-payload": (line) => {
    let value;
    if (line !== "") {
      try {
        value = JSON.parse(line);
      } catch {
        return JSON.stringify({ error: "input is not valid JSON" });
      }
    }
    return JSON.stringify(Buffer.from(encodeMigrationPayload(value)).toString("base64"));
  },
  "decode-payload": (line) => {
    if (!BASE64.test(line)) return JSON.stringify({ error: "input is not valid base64" });
    return JSON.stringify(decodeMigrationPayload(new Uint8Array(Buffer.from(line, "base64"))));
  },
};

/** Splits stdin text into lines exactly as the Rust binary does. */
export function splitLines(text) {
  const lines = text.split("\n");
  if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();
  return lines;
}
