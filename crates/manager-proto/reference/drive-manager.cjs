// Drives a Manager at the address given (`node drive-manager.cjs 127.0.0.1:PORT`) with the
// package's own generated client (`ManagerClient` from lib/manager_grpc_pb.js, over
// @grpc/grpc-js): the event stream's snapshot, a node under an id we choose, a stored job started
// under two roles on two nodes, JobSearch by tag, stop, refusals, complete, delete, terminate,
// and a second stream's snapshot. Prints one JSON object {checks: {name: ok}, rpcs: [...],
// failures: [...]} and exits 1 if any check failed.
"use strict";
const grpc = require("@grpc/grpc-js");
const api = require("./api.cjs");
const pb = require("@norskvideo/norsk-api/lib/manager_pb.js");
const common = require("@norskvideo/norsk-api/lib/shared/common_pb.js");

const address = process.argv[2];
const client = new api.ManagerClient(address, grpc.credentials.createInsecure());
const checks = {};
const failures = [];
const rpcs = new Set();
const check = (name, ok, detail) => {
  checks[name] = Boolean(ok);
  if (!ok) failures.push(`${name}: ${detail ?? ""}`);
};

function unary(method, req) {
  rpcs.add(method);
  return new Promise((resolve) => client[method](req, (err, resp) => resolve({ err, resp })));
}

function collect(method, req) {
  rpcs.add(method);
  return new Promise((resolve) => {
    const out = [];
    const call = client[method](req);
    call.on("data", (m) => out.push(m));
    call.on("end", () => resolve({ out }));
    call.on("error", (err) => resolve({ out, err }));
  });
}

/** An open event stream: its snapshot, then waits for live events matching a predicate. */
function openStream() {
  rpcs.add("eventStream");
  const call = client.eventStream(new pb.EventStreamRequest({ pendingWindowS: 60 }));
  const events = [];
  let waiters = [];
  let snapshot = null;
  call.on("data", (e) => {
    if (snapshot === null) {
      if (e.event.case === "initialDataComplete") snapshot = { events: events.splice(0), done: e.event.value };
      else events.push(e);
    } else events.push(e);
    waiters = waiters.filter((w) => !w());
  });
  call.on("error", () => {});
  const until = (pred, ms = 20000) =>
    new Promise((resolve) => {
      const t = setTimeout(() => resolve(null), ms);
      const w = () => {
        const found = snapshot === null ? undefined : pred(snapshot, events);
        if (found) {
          clearTimeout(t);
          resolve(found);
          return true;
        }
        return false;
      };
      if (!w()) waiters.push(w);
    });
  return { call, until };
}

const jobId = (id) => new common.JobId({ jobId: id });
const nodeId = (id) => new common.NodeId({ nodeId: id });
const liveEvent = (kind, pred) => (_, events) => events.find((e) => e.event.case === kind && pred(e.event.value));
const roleSteps = (jwh) => {
  const last = {};
  for (const h of jwh.historyEntry) {
    const v = h.historyEntry.value;
    if (v && v.role !== undefined) last[v.role] = h.historyEntry.case;
  }
  return last;
};

async function main() {
  const s1 = openStream();
  const snap = await s1.until((s) => s);
  check("snapshot closed by InitialDataComplete", snap, "no InitialDataComplete");
  const physical = snap ? snap.events.filter((e) => e.event.case === "physicalNodeConnected").map((e) => e.event.value.node.id) : [];
  check("snapshot lists the physical nodes", physical.includes("onprem-a1"), JSON.stringify(physical));
  check("InitialDataComplete carries provider health", snap && snap.done.health.length > 0, "no health");

  let r = await unary("createAwsNode", new pb.CreateAwsNodeRequest({ nodeId: nodeId("js-aws-1"), tags: { owner: "js" }, region: "eu-west-1", instanceType: "m5.xlarge" }));
  check("CreateAwsNode answers Empty", !r.err, r.err?.message);
  const started = await s1.until(liveEvent("nodeStarted", (v) => v.nodeMetadata.nodeId.nodeId === "js-aws-1"));
  check("NodeStarted for the caller's node id, with its tags", started && started.event.value.nodeMetadata.tags.owner === "js", "no NodeStarted");
  r = await unary("createAwsNode", new pb.CreateAwsNodeRequest({ nodeId: nodeId("js-aws-1"), region: "eu-west-1", instanceType: "m5.xlarge" }));
  check("a taken node id is ALREADY_EXISTS", r.err?.code === grpc.status.ALREADY_EXISTS, r.err?.message);
  r = await unary("createAwsNode", new pb.CreateAwsNodeRequest({ nodeId: nodeId("js-aws-2"), region: "eu-west-1", instanceType: "no.such" }));
  check("an instance type no pool offers is INVALID_ARGUMENT", r.err?.code === grpc.status.INVALID_ARGUMENT, r.err?.message);

  r = await unary("createJob", new pb.Job({ jobId: jobId("js-job-1"), description: "driven by the package's client", tags: { bundle: "news", owner: "js" } }));
  check("CreateJob answers a hash", !r.err && r.resp.hash > 0n, r.err?.message);
  const active = await s1.until(liveEvent("jobActive", (v) => v.jobWithHistory.job.jobId.jobId === "js-job-1"));
  check("JobActive for the stored job", active, "no JobActive");

  r = await unary("startJob", new pb.StartJobRequest({ jobId: jobId("js-job-1"), role: "primary", nodeId: nodeId("js-aws-1") }));
  check("StartJob primary answers Empty", !r.err, r.err?.message);
  r = await unary("startJob", new pb.StartJobRequest({ jobId: jobId("js-job-1"), role: "backup", nodeId: nodeId("onprem-a1") }));
  check("StartJob backup answers Empty", !r.err, r.err?.message);
  const both = await s1.until(liveEvent("jobUpdated", (v) => {
    const last = roleSteps(v.jobWithHistory);
    return last.primary === "jobRunning" && last.backup === "jobRunning";
  }));
  check("one job runs under two roles", both, "no JobUpdated with both running");
  r = await unary("startJob", new pb.StartJobRequest({ jobId: jobId("nope"), role: "primary", nodeId: nodeId("js-aws-1") }));
  check("StartJob of an unknown job is NOT_FOUND", r.err?.code === grpc.status.NOT_FOUND, r.err?.message);

  const found = await collect("jobSearch", new pb.JobSearchRequest({ jobFilter: [new pb.JobFilter({ jobFilter: { case: "tagFilter", value: new pb.TagFilter({ tagName: "bundle", comparison: { case: "eq", value: "news" } }) } })] }));
  check("JobSearch by tag finds the job with its two instances", !found.err && found.out.length === 1 && found.out[0].instances.length === 2, JSON.stringify(found.out.map((j) => j.instances.length)));
  const none = await collect("jobSearch", new pb.JobSearchRequest({ jobFilter: [new pb.JobFilter({ jobFilter: { case: "tagFilter", value: new pb.TagFilter({ tagName: "owner", comparison: { case: "eq", value: "someone-else" } }) } })] }));
  check("JobSearch with a tag nothing has finds nothing", !none.err && none.out.length === 0, String(none.out.length));

  r = await unary("stopJob", new pb.StopJobRequest({ jobId: jobId("js-job-1"), role: "backup", nodeId: nodeId("onprem-a1") }));
  check("StopJob answers Empty", !r.err, r.err?.message);
  const stopped = await s1.until(liveEvent("jobUpdated", (v) => roleSteps(v.jobWithHistory).backup === "jobStopped"));
  check("the backup's history ends stopped", stopped, "no JobUpdated with backup stopped");

  r = await unary("updateJob", new pb.Job({ jobId: jobId("js-job-1"), description: "updated", tags: { bundle: "news", owner: "js" } }));
  check("UpdateJob answers a new hash", !r.err && r.resp.hash > 1n, r.err?.message);
  r = await unary("completeJob", jobId("js-job-1"));
  check("CompleteJob answers Empty", !r.err, r.err?.message);
  const completed = await s1.until(liveEvent("jobUpdated", (v) => v.jobWithHistory.historyEntry.some((h) => h.historyEntry.case === "jobCompleted")));
  check("the job's history ends completed", completed, "no JobCompleted");
  r = await unary("deleteJob", jobId("js-job-1"));
  check("DeleteJob answers Empty", !r.err, r.err?.message);
  const deleted = await s1.until(liveEvent("jobDeleted", (v) => v.jobId.jobId === "js-job-1"));
  check("JobDeleted", deleted, "no JobDeleted");

  r = await unary("terminateNode", nodeId("js-aws-1"));
  check("TerminateNode answers Empty", !r.err, r.err?.message);
  const gone = await s1.until(liveEvent("nodeStopped", (v) => v.nodeId.nodeId === "js-aws-1"));
  check("NodeStopped", gone, "no NodeStopped");
  s1.call.cancel();

  const s2 = openStream();
  const snap2 = await s2.until((s) => s);
  const ids = snap2 ? snap2.events.map((e) => e.event.value.nodeMetadata?.nodeId?.nodeId ?? e.event.value.node?.id).filter(Boolean) : [];
  check("a second stream's snapshot has the physical nodes and not the terminated one", snap2 && ids.includes("onprem-a1") && !ids.includes("js-aws-1"), JSON.stringify(ids));
  s2.call.cancel();

  process.stdout.write(JSON.stringify({ checks, rpcs: [...rpcs].sort(), failures }) + "\n");
  client.close();
  process.exit(failures.length ? 1 : 0);
}

main().catch((e) => {
  process.stdout.write(JSON.stringify({ checks, rpcs: [...rpcs].sort(), failures: failures.concat([String(e && e.stack)]) }) + "\n");
  process.exit(1);
});
