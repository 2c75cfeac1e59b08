#!/usr/bin/env node
// `node cli.mjs <subcommand>`: the reference side of the side-by-side conformance test.
import { readFileSync } from "node:fs";
import { OPS, splitLines } from "./ops.mjs";

const op = OPS[process.argv.slice(2).join(" ")];
if (!op) {
  process.stderr.write("usage: cli.mjs parse-frame --from job|worker | parse-path | encode-payload | decode-payload\n");
  process.exit(2);
}
const out = splitLines(readFileSync(0, "utf8")).map((line) => op(line) + "\n");
process.stdout.write(out.join(""));
