import * as ms from "@norskvideo/ctl-product-template-schema/migration-socket";
const J = (x) => JSON.stringify(x);
const pj = (t) => { try { return J(ms.parseJobToWorkerFrame(t)); } catch (e) { return "THROW " + e.constructor.name + " " + e.message; } };
for (const d of [129, 1000, 2000, 3000, 5000, 10000, 20000, 32000]) {
  const a = '{"type":"state","payload":' + '['.repeat(d) + ']'.repeat(d) + '}';
  const o = '{"type":"state","payload":' + '{"a":'.repeat(d) + '1' + '}'.repeat(d) + '}';
  const ra = pj(a), ro = pj(o);
  console.log(d, a.length, ra.slice(0, 80), '|', o.length, ro.slice(0,80));
  let dec; try { dec = J(ms.decodeMigrationPayload(new TextEncoder().encode('['.repeat(d) + ']'.repeat(d)))).length } catch(e) { dec = "THROW " + e.message }
  console.log('  decode', dec);
}
console.log(pj('{"type":"state","payload":{"9007199254740991":1,"9007199254740992":1,"4294967296":1,"18446744073709551616":1,"0":1,"b":2,"00":3,"1e3":3,"-0":3}}'));
console.log(J(JSON.parse('{"9007199254740991":1,"9007199254740992":1,"4294967296":1,"4294967295":1,"4294967294":1,"0":1,"b":2}')));
console.log(pj('{"skewMs":"x","failed":[{"id":1}],"applied":["a",1],"type":"target-applied"}'));
console.log(pj('{"type":"target-applied","applied":5,"failed":5,"skewMs":"x"}'));
console.log(pj('{"type":"target-applied","applied":[5],"failed":[5],"skewMs":1}'));
console.log(pj('{"type":"target-applied","failed":[5], "applied":[true]}'));
console.log(pj('{"type":"state-refused","reason":{}}'));
console.log(pj('{"type":"hello","token":[]}'), pj('{"type":"hello","token":true}'), pj('{"type":"hello","token":null}'));
console.log(J(ms.parseWorkerToJobFrame('{"type":"hello-ack","migration":{"side":5}}')));
console.log(J(ms.parseWorkerToJobFrame('{"type":"hello-ack","migration":[]}')));
console.log(J(ms.parseWorkerToJobFrame('{"type":"cutover-apply","payload":1}')));
console.log(J(ms.parseWorkerToJobFrame('{"type":"cutover-apply","payload":1e999, "migrationId":3}')));
