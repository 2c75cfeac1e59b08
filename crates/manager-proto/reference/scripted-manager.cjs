// A small Manager written against the package's own service definition (`ManagerService` from
// lib/manager_grpc_pb.js, served by @grpc/grpc-js), for tests of our client: it keeps nodes and
// stored jobs, answers the calls as the published API does (Empty, outcomes on the event
// stream), and sends every EventStream a snapshot closed by InitialDataComplete, then live
// changes. A test steers it with JSON lines on stdin:
//
//   {"cmd":"drop"}                           end every open event stream (UNAVAILABLE)
//   {"cmd":"silent","on":true}               stop (or resume) sending on open streams
//   {"cmd":"offline","deleteJob":"j"}        change the state without telling any stream
//   {"cmd":"offline","addNode":"n","tags":{}}
//
// It prints {"port":N} once listening and {"ok":"<cmd>"} after each command; a bad line gets
// {"error":"..."} and changes nothing.
"use strict";
const grpc = require("@grpc/grpc-js");
const readline = require("node:readline");
const { Empty, Timestamp } = require("@bufbuild/protobuf");
const api = require("./api.cjs");
const pb = require("@norskvideo/norsk-api/lib/manager_pb.js");
const common = require("@norskvideo/norsk-api/lib/shared/common_pb.js");

const nodes = new Map(); // id -> {tags}
const jobs = new Map(); // id -> {job, history: [JobHistoryEntry], instances: Map(role -> node)}
const streams = new Set();
let silent = false;

const now = () => Timestamp.fromDate(new Date());
const nodeMetadata = (id) => new common.NodeMetadata({ nodeId: new common.NodeId({ nodeId: id }), tags: nodes.get(id)?.tags ?? {} });
const runningJobs = (nodeId) => {
  const out = [];
  for (const [jobId, j] of jobs) {
    for (const [role, n] of j.instances) {
      if (n === nodeId) out.push(new pb.RunningJob({ jobKey: new common.ActiveJobKey({ jobId: new common.JobId({ jobId }), role }), nodeId: new common.NodeId({ nodeId }) }));
    }
  }
  return out;
};
const withHistory = (j) => new pb.JobWithHistory({ job: j.job, historyEntry: j.history });

function send(event) {
  if (silent) return;
  for (const call of streams) call.write(new pb.EventStreamEvent({ event }));
}

function snapshot(call) {
  for (const id of nodes.keys()) {
    call.write(new pb.EventStreamEvent({ event: { case: "nodeRunning", value: new pb.NodeRunning({ nodeMetadata: nodeMetadata(id), instances: runningJobs(id) }) } }));
  }
  for (const j of jobs.values()) {
    call.write(new pb.EventStreamEvent({ event: { case: "jobActive", value: new pb.JobActive({ jobWithHistory: withHistory(j) }) } }));
  }
  call.write(new pb.EventStreamEvent({ event: { case: "initialDataComplete", value: new pb.InitialDataComplete({}) } }));
}

const fail = (cb, code, details) => cb({ code, details });
const jobUpdated = (j) => send({ case: "jobUpdated", value: new pb.JobUpdated({ jobWithHistory: withHistory(j) }) });
const entry = (c, value) => new pb.JobHistoryEntry({ historyEntry: { case: c, value } });

function instanceStep(call, cb, kind) {
  const { jobId, role, nodeId } = call.request;
  const j = jobs.get(jobId?.jobId ?? "");
  const node = nodeId?.nodeId ?? "";
  if (!j) return fail(cb, grpc.status.NOT_FOUND, `no job ${jobId?.jobId}`);
  if (!nodes.has(node)) return fail(cb, grpc.status.NOT_FOUND, `no node ${node}`);
  if (kind === "start") {
    j.instances.set(role, node);
    j.history.push(entry("jobRunning", new pb.JobHistoryJobRunning({ timestamp: now(), role, nodeMetadata: nodeMetadata(node) })));
  } else {
    if (j.instances.get(role) !== node) return fail(cb, grpc.status.NOT_FOUND, `${role} of ${jobId.jobId} is not on ${node}`);
    j.instances.delete(role);
    j.history.push(entry("jobStopped", new pb.JobHistoryJobStopped({ timestamp: now(), role, nodeMetadata: nodeMetadata(node) })));
  }
  jobUpdated(j);
  cb(null, new Empty());
}

function createNode(call, cb) {
  const id = call.request.nodeId?.nodeId ?? "";
  if (!id) return fail(cb, grpc.status.INVALID_ARGUMENT, "node_id is required");
  if (nodes.has(id)) return fail(cb, grpc.status.ALREADY_EXISTS, `node ${id} exists`);
  nodes.set(id, { tags: { ...call.request.tags } });
  cb(null, new Empty());
  send({ case: "nodeStarting", value: new pb.NodeStarting({ nodeMetadata: nodeMetadata(id) }) });
  setTimeout(() => {
    if (nodes.has(id)) send({ case: "nodeStarted", value: new pb.NodeStarted({ nodeMetadata: nodeMetadata(id) }) });
  }, 20);
}

const handlers = {
  createStatusChannel(call) {
    call.write(new pb.NorskStatusEvent({ message: { case: "hello", value: new pb.Hello({}) } }));
  },
  createJob(call, cb) {
    const id = call.request.jobId?.jobId ?? "";
    if (!id) return fail(cb, grpc.status.INVALID_ARGUMENT, "job_id is required");
    if (jobs.has(id)) return fail(cb, grpc.status.ALREADY_EXISTS, `job ${id} exists`);
    const j = { job: call.request, history: [entry("jobCreated", new pb.JobHistoryJobCreated({ timestamp: now() }))], instances: new Map() };
    jobs.set(id, j);
    cb(null, new pb.JobHash({ hash: BigInt(jobs.size) }));
    send({ case: "jobActive", value: new pb.JobActive({ jobWithHistory: withHistory(j) }) });
  },
  updateJob(call, cb) {
    const id = call.request.jobId?.jobId ?? "";
    const j = jobs.get(id);
    if (!j) return fail(cb, grpc.status.NOT_FOUND, `no job ${id}`);
    j.history.push(entry("jobUpdated", new pb.JobHistoryJobUpdated({ timestamp: now(), previousJob: j.job })));
    j.job = call.request;
    cb(null, new pb.JobHash({ hash: BigInt(j.history.length) }));
    jobUpdated(j);
  },
  deleteJob(call, cb) {
    const id = call.request.jobId;
    if (!jobs.delete(id)) return fail(cb, grpc.status.NOT_FOUND, `no job ${id}`);
    cb(null, new Empty());
    send({ case: "jobDeleted", value: new pb.JobDeleted({ jobId: new common.JobId({ jobId: id }) }) });
  },
  jobSearch(call) {
    const filters = call.request.jobFilter;
    for (const [id, j] of jobs) {
      const tags = j.job.tags ?? {};
      const match = filters.every((f) => {
        if (f.jobFilter.case !== "tagFilter") return true;
        const t = f.jobFilter.value;
        const c = t.comparison;
        if (c.case === "eq") return tags[t.tagName] === c.value;
        if (c.case === "neq") return tags[t.tagName] !== c.value;
        if (c.case === "exists") return (t.tagName in tags) === c.value;
        if (c.case === "re") return new RegExp(c.value).test(tags[t.tagName] ?? "");
        return false;
      });
      if (!match) continue;
      const instances = [...j.instances].map(([role, node]) => new pb.RunningJob({ jobKey: new common.ActiveJobKey({ jobId: new common.JobId({ jobId: id }), role }), nodeId: new common.NodeId({ nodeId: node }) }));
      call.write(new pb.CurrentJob({ job: j.job, instances }));
    }
    call.end();
  },
  createAwsNode: createNode,
  createOciNode: createNode,
  updatePhysicalNode(call, cb) {
    cb(null, new Empty());
  },
  terminateNode(call, cb) {
    const id = call.request.nodeId;
    if (!nodes.has(id)) return fail(cb, grpc.status.NOT_FOUND, `no node ${id}`);
    cb(null, new Empty());
    send({ case: "nodeStopping", value: new pb.NodeStopping({ nodeId: new common.NodeId({ nodeId: id }) }) });
    nodes.delete(id);
    send({ case: "nodeStopped", value: new pb.NodeStopped({ nodeId: new common.NodeId({ nodeId: id }) }) });
  },
  startJob(call, cb) {
    instanceStep(call, cb, "start");
  },
  stopJob(call, cb) {
    instanceStep(call, cb, "stop");
  },
  completeJob(call, cb) {
    const j = jobs.get(call.request.jobId);
    if (!j) return fail(cb, grpc.status.NOT_FOUND, `no job ${call.request.jobId}`);
    j.history.push(entry("jobCompleted", new pb.JobHistoryJobCompleted({ timestamp: now() })));
    cb(null, new Empty());
    jobUpdated(j);
  },
  eventStream(call) {
    snapshot(call);
    streams.add(call);
    call.on("cancelled", () => streams.delete(call));
    call.on("close", () => streams.delete(call));
  },
};

function command(line) {
  let c;
  try {
    c = JSON.parse(line);
  } catch {
    return { error: "not JSON" };
  }
  switch (c.cmd) {
    case "drop":
      for (const call of streams) call.emit("error", { code: grpc.status.UNAVAILABLE, details: "dropped by the test" });
      streams.clear();
      break;
    case "silent":
      silent = Boolean(c.on);
      break;
    case "offline":
      if (typeof c.deleteJob === "string") jobs.delete(c.deleteJob);
      if (typeof c.addNode === "string") nodes.set(c.addNode, { tags: c.tags ?? {} });
      break;
    default:
      return { error: `unknown command ${c.cmd}` };
  }
  return { ok: c.cmd };
}

const server = new grpc.Server();
server.addService(api.service, handlers);
server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) => {
  if (err) {
    console.error(err);
    process.exit(1);
  }
  console.log(JSON.stringify({ port }));
  const rl = readline.createInterface({ input: process.stdin });
  rl.on("line", (line) => console.log(JSON.stringify(command(line))));
  rl.on("close", () => process.exit(0));
});
