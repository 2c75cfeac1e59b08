// A minimal live job that can be moved with the `handover` migration strategy.
//
// The "work" is a counter standing in for output (milliseconds of media produced); what a real
// job hands over is whatever lets its successor continue at the exact position: an output
// position, sequence numbers, a session. The worker starts this process with
// NORSK_WORKER_WS_URL and NORSK_WORKER_TOKEN; every frame from the worker is parsed with the
// published contract (@norskvideo/ctl-product-template-schema, `migration-socket`), so a frame
// the contract does not allow is never acted on.
//
// The handover, as this job sees it (docs/concepts.md has the sequence diagram):
//   source: get-state → `state`; cutover-ready → stop output → `source-stopped-output`
//   target: hello-ack{migration} → initial-state → `target-ready`; cutover-apply → start output
//           at the handed-over position → `target-applied`
//   either: abort → carry on (source) or wait to be stopped (target)

import { randomUUID } from "node:crypto";
import WebSocket from "ws";
import {
  JOB_SOCKET_ENV,
  JOB_SOCKET_MAX_FRAME_BYTES,
  parseWorkerToJobFrame,
  type JobToWorkerMessage,
  type MigrationPayload,
  type WorkerToJobMessage,
} from "@norskvideo/ctl-product-template-schema/migration-socket";

/** What this job hands to its successor. */
interface HandoverState {
  /** Milliseconds of output produced by this job and every job it took over from. */
  position: number;
  /** Created by the first instance, carried across every handover. */
  session: string;
  /** How many handovers this session has been through. */
  handovers: number;
}

function log(event: string, detail: Record<string, unknown> = {}): void {
  // One JSON object per line: easy to read and to grep in a worker's logs.
  process.stdout.write(JSON.stringify({ at: new Date().toISOString(), event, ...detail }) + "\n");
}

function asState(payload: MigrationPayload): HandoverState | undefined {
  if (payload === null || typeof payload !== "object" || Array.isArray(payload)) return undefined;
  const p = payload as Record<string, unknown>;
  if (typeof p.position !== "number" || !Number.isFinite(p.position) || p.position < 0) return undefined;
  if (typeof p.session !== "string" || p.session.length === 0 || p.session.length > 128) return undefined;
  const handovers = typeof p.handovers === "number" && Number.isInteger(p.handovers) ? p.handovers : 0;
  return { position: p.position, session: p.session, handovers };
}

class Output {
  private producing = false;
  private since = 0;
  private base = 0;

  /** Starts producing from `position`. */
  start(position: number): void {
    this.base = position;
    this.since = Date.now();
    this.producing = true;
  }

  /** Stops producing; returns the exact position reached. */
  stop(): number {
    this.base = this.position();
    this.producing = false;
    return this.base;
  }

  position(): number {
    return this.producing ? this.base + (Date.now() - this.since) : this.base;
  }
}

function main(): void {
  const url = process.env[JOB_SOCKET_ENV.url];
  const token = process.env[JOB_SOCKET_ENV.token];
  const output = new Output();
  let session: string = randomUUID();
  let handovers = 0;

  if (!url || !token) {
    // No listener on this worker: run, but this job cannot be handed over.
    log("no-job-socket", { reason: `${JOB_SOCKET_ENV.url} or ${JOB_SOCKET_ENV.token} is not set` });
    output.start(0);
    return;
  }

  const socket = new WebSocket(url, { maxPayload: JOB_SOCKET_MAX_FRAME_BYTES });
  let target: string | undefined; // the migration this instance was started as the target of

  const send = (frame: JobToWorkerMessage): void => {
    const text = JSON.stringify(frame);
    if (Buffer.byteLength(text) > JOB_SOCKET_MAX_FRAME_BYTES) {
      log("frame-too-large", { type: frame.type });
      return;
    }
    socket.send(text);
  };

  socket.on("open", () => {
    log("connected", { url });
    send({ type: "hello", token });
  });

  socket.on("message", (data, isBinary) => {
    if (isBinary) {
      log("ignored-binary-frame");
      return;
    }
    const parsed = parseWorkerToJobFrame(data.toString());
    if (!parsed.ok) {
      log("ignored-invalid-frame", { reason: parsed.reason });
      return;
    }
    handle(parsed.message);
  });

  const handle = (frame: WorkerToJobMessage): void => {
    switch (frame.type) {
      case "hello-ack":
        if (frame.migration) {
          target = frame.migration.id;
          log("started-as-target", { migrationId: target });
        } else {
          output.start(0);
          log("producing", { session });
        }
        return;
      case "get-state": {
        const state: HandoverState = { position: output.position(), session, handovers };
        log("state-given", { migrationId: frame.migrationId, position: state.position, session });
        send({ type: "state", payload: { ...state } });
        return;
      }
      case "initial-state": {
        const state = asState(frame.payload);
        if (!state) {
          log("refusing-initial-state", { payload: frame.payload });
          send({ type: "abort", reason: "initial-state is not this job's handover state" });
          return;
        }
        session = state.session;
        handovers = state.handovers + 1;
        output.start(state.position);
        output.stop(); // prepared at the handed-over position; produces only after cutover-apply
        log("initial-state-received", { migrationId: frame.migrationId, state });
        send({ type: "target-ready", payload: { resumeFrom: state.position, session } });
        return;
      }
      case "cutover-ready": {
        const position = output.stop();
        const stoppedAtMs = Date.now();
        log("source-stopped-output", { migrationId: frame.migrationId, position });
        send({ type: "source-stopped-output", payload: { position, stoppedAtMs, session } });
        return;
      }
      case "cutover-apply": {
        const payload = frame.payload as Record<string, unknown> | null;
        const position = typeof payload?.position === "number" ? payload.position : output.position();
        const stoppedAtMs = typeof payload?.stoppedAtMs === "number" ? payload.stoppedAtMs : Date.now();
        output.start(position);
        const skewMs = Math.max(0, Date.now() - stoppedAtMs);
        log("producing", { session, position, handovers, skewMs });
        send({ type: "target-applied", applied: ["output"], failed: [], skewMs });
        return;
      }
      case "abort":
        log("aborted", { migrationId: frame.migrationId, reason: frame.reason, target: target !== undefined });
        // A source keeps producing; a target waits for its worker to stop it.
        if (target === undefined) output.start(output.position());
        return;
    }
  };

  socket.on("close", (code, reason) => {
    log("closed", { code, reason: reason.toString() });
    process.exit(0);
  });
  socket.on("error", (err) => {
    log("socket-error", { message: err.message });
  });
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    process.on(signal, () => {
      log("stopping", { signal, position: output.position(), session });
      socket.close(1000, "stopping");
      process.exit(0);
    });
  }
}

main();
