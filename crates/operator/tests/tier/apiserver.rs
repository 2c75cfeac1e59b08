//! An in-memory apiserver for the controller tier: a `tower` service a `kube::Client` is built
//! on, holding objects as JSON and answering the calls a reconcile makes (get, list, create,
//! merge patch, apply, replace, delete), recording each one, and refusing the ones a test scripts
//! (409, 422, 500, …). It is not an apiserver: no watch, no admission, no schema. What it does
//! keep is what a pass's outcome depends on: resourceVersion preconditions (409 on a stale
//! write), the status subresource (a status write changes only `status`, a main write keeps
//! it), generation bumps on spec changes, and deletion that waits for finalizers.
//!
//! Server-side apply is taken as "the applied fields replace the ones there": for a status,
//! which the operator's one field manager owns whole, that is what the apiserver does; for other
//! writes the operator uses merge patches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

/// One request the apiserver answered (or refused).
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    /// The path without the query, e.g. `/apis/automanager.norsk.io/v1alpha1/placementpools/a`.
    pub path: String,
    /// The HTTP status it was answered with.
    pub code: u16,
    /// The request's body (`null` when it had none).
    pub body: Value,
}

impl Call {
    /// Whether this is a write (anything but GET).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }
}

#[derive(Debug)]
struct Fault {
    method: Method,
    path_ends_with: String,
    code: u16,
}

#[derive(Debug, Default)]
struct Store {
    /// (collection prefix, plural) → (namespace, name) → object.
    objects: BTreeMap<(String, String), BTreeMap<(String, String), Value>>,
    resource_version: u64,
    calls: Vec<Call>,
    faults: Vec<Fault>,
}

/// Cheap to clone; clones share the objects.
#[derive(Clone, Debug, Default)]
pub struct MemoryApiserver(Arc<Mutex<Store>>);

/// Where a request points.
struct Target {
    collection: (String, String),
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn parse(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (format!("/api/{v}"), rest),
        ["apis", g, v, rest @ ..] => (format!("/apis/{g}/{v}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
        _ => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some((*name).to_owned()), false),
        [plural, name, "status"] => (*plural, Some((*name).to_owned()), true),
        _ => return None,
    };
    Some(Target {
        collection: (prefix, plural.to_owned()),
        namespace,
        name,
        status,
    })
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
        "metadata": {},
    })
}

fn reason_of(code: u16) -> &'static str {
    match code {
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        _ => "InternalError",
    }
}

/// The `labelSelector` of a list's query, as `key=value` pairs (the equality form, which is
/// all the operator uses).
fn label_selector(query: &str) -> Vec<(String, String)> {
    let Some(raw) = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("labelSelector="))
    else {
        return Vec::new();
    };
    let decoded = percent_decoded(raw);
    decoded
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// `raw` with its `%XX` escapes (and `+` for space) decoded.
fn percent_decoded(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl MemoryApiserver {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A `kube::Client` whose every request this apiserver answers.
    pub fn client(&self) -> kube::Client {
        let me = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let me = me.clone();
            async move { Ok::<_, std::convert::Infallible>(me.handle(req).await) }
        });
        kube::Client::new(service, "default")
    }

    /// Stores `object` as a client's create would (a test's given state); returns it as stored.
    pub fn insert<K>(&self, object: &K) -> K
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        let path = collection_path::<K>(object.meta().namespace.as_deref());
        let body = serde_json::to_value(object).unwrap_or_default();
        let (code, stored) = self.create(&path, body);
        assert_eq!(code, 201, "insert {path}: {stored}");
        serde_json::from_value(stored).unwrap_or_else(|e| panic!("insert {path}: {e}"))
    }

    /// The object as the apiserver holds it now.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let t = parse(&format!("{}/{name}", collection_path::<K>(namespace)))?;
        let store = self.store();
        let obj = store
            .objects
            .get(&t.collection)?
            .get(&(t.namespace.unwrap_or_default(), name.to_owned()))?;
        serde_json::from_value(obj.clone()).ok()
    }

    /// Every object of kind `K`, in every namespace.
    pub fn list_all<K>(&self) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
    {
        let Some(t) = parse(&collection_path::<K>(None)) else {
            return Vec::new();
        };
        let store = self.store();
        store
            .objects
            .get(&t.collection)
            .into_iter()
            .flatten()
            .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
            .collect()
    }

    /// The next request of `method` whose path ends with `path_ends_with` is refused with
    /// `code`, once.
    pub fn refuse_next(&self, method: Method, path_ends_with: &str, code: u16) {
        self.store().faults.push(Fault {
            method,
            path_ends_with: path_ends_with.to_owned(),
            code,
        });
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.store().calls.clone()
    }

    /// The calls refused so far (status 400 and above), as `METHOD path code`.
    pub fn refused(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.code >= 400)
            .map(|c| format!("{} {} {}", c.method, c.path, c.code))
            .collect()
    }

    /// The writes so far as `METHOD path` (events left out: they are published off the pass).
    pub fn writes(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.is_write() && !c.path.contains("/events"))
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }

    /// Changes the object as a user's update would (`edit` sees it as stored; status is kept,
    /// a spec change bumps the generation); returns it as stored. Not recorded as a call.
    pub fn edit<K>(&self, namespace: Option<&str>, name: &str, edit: impl FnOnce(&mut K)) -> K
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        self.rewrite::<K>(namespace, name, false, edit)
    }

    /// Changes the object's status as another writer would; returns it as stored. Not recorded.
    pub fn edit_status<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        edit: impl FnOnce(&mut K),
    ) -> K
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        self.rewrite::<K>(namespace, name, true, edit)
    }

    fn rewrite<K>(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: bool,
        edit: impl FnOnce(&mut K),
    ) -> K
    where
        K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
    {
        let path = format!("{}/{name}", collection_path::<K>(namespace));
        let mut obj: K = self
            .get(namespace, name)
            .unwrap_or_else(|| panic!("no object at {path}"));
        edit(&mut obj);
        let body = serde_json::to_value(&obj).unwrap_or_default();
        let mut t = parse(&path).unwrap_or_else(|| panic!("not an object path: {path}"));
        t.status = status;
        let (code, stored) = self.write(&t, |o| {
            *o = body;
            None
        });
        assert_eq!(code, 200, "edit {path}: {stored}");
        serde_json::from_value(stored).unwrap_or_else(|e| panic!("edit {path}: {e}"))
    }

    /// Deletes the object at `path` as a client's delete would: marked while finalizers hold it,
    /// gone otherwise. Not recorded as a call of the pass.
    pub fn delete_path(&self, path: &str) {
        let t = parse(path).unwrap_or_else(|| panic!("not an object path: {path}"));
        let (code, body) = self.delete(&t);
        assert_eq!(code, 200, "delete {path}: {body}");
    }

    /// The Events stored so far, as `(regarding's name, reason, note)`.
    pub fn events(&self) -> Vec<(String, String, String)> {
        let store = self.store();
        let s = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        store
            .objects
            .iter()
            .filter(|((_, plural), _)| plural == "events")
            .flat_map(|(_, objects)| objects.values())
            .map(|e| (s(e, "/regarding/name"), s(e, "/reason"), s(e, "/note")))
            .collect()
    }

    /// Forgets the calls so far.
    pub fn clear_calls(&self) {
        self.store().calls.clear();
    }

    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let selector = label_selector(req.uri().query().unwrap_or_default());
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = req.into_body().collect_bytes().await.unwrap_or_default();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap_or(Value::Null)
        };
        let (code, out) = self.answer(&method, &path, &content_type, body.clone(), &selector);
        self.store().calls.push(Call {
            method,
            path,
            code,
            body,
        });
        let mut resp = Response::new(Body::from(serde_json::to_vec(&out).unwrap_or_default()));
        *resp.status_mut() =
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }

    fn answer(
        &self,
        method: &Method,
        path: &str,
        content_type: &str,
        body: Value,
        selector: &[(String, String)],
    ) -> (u16, Value) {
        {
            let mut store = self.store();
            if let Some(i) = store
                .faults
                .iter()
                .position(|f| f.method == *method && path.ends_with(&f.path_ends_with))
            {
                let f = store.faults.remove(i);
                return (
                    f.code,
                    status_body(f.code, reason_of(f.code), "refused by the test"),
                );
            }
        }
        let Some(t) = parse(path) else {
            return (404, status_body(404, "NotFound", "no such path"));
        };
        match (method.clone(), &t.name) {
            (Method::GET, Some(_)) => self.read(&t),
            (Method::GET, None) => self.list(&t, selector),
            (Method::POST, None) => self.create(path, body),
            // Server-side apply creates what is not there yet, as the apiserver does.
            (Method::PATCH, Some(name))
                if content_type.contains("apply-patch") && !t.status && !self.exists(&t) =>
            {
                let collection = path.trim_end_matches('/').trim_end_matches(name.as_str());
                self.create(collection.trim_end_matches('/'), body)
            }
            (Method::PATCH, Some(_)) => self.write(&t, |obj| {
                if content_type.contains("apply-patch") {
                    apply(obj, &body, t.status);
                } else if content_type.contains("json-patch") {
                    // A failed `test` op is the apiserver's 422; here the object is left
                    // as it was and the write refused the same way.
                    let applied = serde_json::from_value::<json_patch::Patch>(body.clone())
                        .map_err(|e| e.to_string())
                        .map(|p| absent_is_null(obj, p))
                        .and_then(|p| json_patch::patch(obj, &p).map_err(|e| e.to_string()));
                    if let Err(e) = applied {
                        return Some(Err(e));
                    }
                    return None;
                } else {
                    merge(obj, &body);
                }
                body.pointer("/metadata/resourceVersion").cloned().map(Ok)
            }),
            (Method::PUT, Some(_)) => self.write(&t, |obj| {
                let rv = body.pointer("/metadata/resourceVersion").cloned();
                *obj = body.clone();
                rv.map(Ok)
            }),
            (Method::DELETE, Some(_)) => self.delete(&t),
            _ => (
                405,
                status_body(405, "MethodNotAllowed", "not answered here"),
            ),
        }
    }

    fn read(&self, t: &Target) -> (u16, Value) {
        let key = (
            t.namespace.clone().unwrap_or_default(),
            t.name.clone().unwrap_or_default(),
        );
        match self
            .store()
            .objects
            .get(&t.collection)
            .and_then(|c| c.get(&key))
        {
            Some(obj) => (200, obj.clone()),
            None => (404, status_body(404, "NotFound", "not found")),
        }
    }

    fn list(&self, t: &Target, selector: &[(String, String)]) -> (u16, Value) {
        let store = self.store();
        let items: Vec<Value> = store
            .objects
            .get(&t.collection)
            .into_iter()
            .flatten()
            .filter(|((ns, _), _)| t.namespace.as_ref().is_none_or(|want| want == ns))
            .filter(|(_, v)| {
                selector.iter().all(|(k, want)| {
                    v.pointer("/metadata/labels")
                        .and_then(|l| l.get(k))
                        .and_then(Value::as_str)
                        == Some(want.as_str())
                })
            })
            .map(|(_, v)| v.clone())
            .collect();
        (
            200,
            json!({
                "apiVersion": "v1",
                "kind": "List",
                "metadata": { "resourceVersion": store.resource_version.to_string() },
                "items": items,
            }),
        )
    }

    fn exists(&self, t: &Target) -> bool {
        let key = (
            t.namespace.clone().unwrap_or_default(),
            t.name.clone().unwrap_or_default(),
        );
        self.store()
            .objects
            .get(&t.collection)
            .is_some_and(|c| c.contains_key(&key))
    }

    fn create(&self, path: &str, mut body: Value) -> (u16, Value) {
        let Some(t) = parse(path) else {
            return (404, status_body(404, "NotFound", "no such path"));
        };
        let mut store = self.store();
        store.resource_version += 1;
        let rv = store.resource_version;
        let namespace = t.namespace.clone().or_else(|| {
            body.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        let name = match body.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) => n.to_owned(),
            None => format!(
                "{}{rv}",
                body.pointer("/metadata/generateName")
                    .and_then(Value::as_str)
                    .unwrap_or("object-")
            ),
        };
        let key = (namespace.clone().unwrap_or_default(), name.clone());
        let collection = store.objects.entry(t.collection).or_default();
        if collection.contains_key(&key) {
            return (
                409,
                status_body(409, "AlreadyExists", &format!("{name} already exists")),
            );
        }
        merge(
            &mut body,
            &json!({ "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": format!("uid-{rv}"),
                "resourceVersion": rv.to_string(),
                "generation": 1,
                "creationTimestamp": stamp(rv),
            }}),
        );
        collection.insert(key, body.clone());
        (201, body)
    }

    /// A patch or replace: `change` edits the object and returns the resourceVersion the
    /// writer asked to be current, if any, or why the patch does not apply (422).
    fn write(
        &self,
        t: &Target,
        change: impl FnOnce(&mut Value) -> Option<Result<Value, String>>,
    ) -> (u16, Value) {
        let key = (
            t.namespace.clone().unwrap_or_default(),
            t.name.clone().unwrap_or_default(),
        );
        let mut store = self.store();
        store.resource_version += 1;
        let rv = store.resource_version;
        let Some(current) = store
            .objects
            .get_mut(&t.collection)
            .and_then(|c| c.get_mut(&key))
        else {
            return (404, status_body(404, "NotFound", "not found"));
        };
        let mut next = current.clone();
        let precondition = match change(&mut next) {
            Some(Err(why)) => return (422, status_body(422, "Invalid", &why)),
            Some(Ok(rv)) => Some(rv),
            None => None,
        };
        if let Some(want) = precondition.filter(|v| !v.is_null())
            && Some(&want) != current.pointer("/metadata/resourceVersion")
        {
            return (
                409,
                status_body(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes to the latest version and try again",
                ),
            );
        }
        // The status subresource changes only status; the main resource never does.
        let mut stored = current.clone();
        if t.status {
            stored["status"] = next.get("status").cloned().unwrap_or(Value::Null);
        } else {
            let status = current.get("status").cloned();
            let spec_changed = next.get("spec") != current.get("spec");
            stored = next;
            match status {
                Some(s) => stored["status"] = s,
                None => {
                    if let Some(o) = stored.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            stored["metadata"]["uid"] = current["metadata"]["uid"].clone();
            stored["metadata"]["creationTimestamp"] =
                current["metadata"]["creationTimestamp"].clone();
            let generation = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            stored["metadata"]["generation"] = json!(generation + i64::from(spec_changed));
        }
        stored["metadata"]["resourceVersion"] = json!(rv.to_string());
        let gone = stored.pointer("/metadata/deletionTimestamp").is_some()
            && stored
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        if gone {
            if let Some(c) = store.objects.get_mut(&t.collection) {
                c.remove(&key);
            }
        } else if let Some(c) = store.objects.get_mut(&t.collection) {
            c.insert(key, stored.clone());
        }
        (200, stored)
    }

    fn delete(&self, t: &Target) -> (u16, Value) {
        let key = (
            t.namespace.clone().unwrap_or_default(),
            t.name.clone().unwrap_or_default(),
        );
        let mut store = self.store();
        store.resource_version += 1;
        let at = stamp(store.resource_version);
        let rv = store.resource_version.to_string();
        let Some(collection) = store.objects.get_mut(&t.collection) else {
            return (404, status_body(404, "NotFound", "not found"));
        };
        let Some(obj) = collection.get_mut(&key) else {
            return (404, status_body(404, "NotFound", "not found"));
        };
        let held = obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if held {
            if obj.pointer("/metadata/deletionTimestamp").is_none() {
                obj["metadata"]["deletionTimestamp"] = json!(at);
            }
            obj["metadata"]["resourceVersion"] = json!(rv);
            return (200, obj.clone());
        }
        let obj = collection.remove(&key).unwrap_or_default();
        (200, obj)
    }
}

/// A time for the write at resourceVersion `rv`: one second per write from 2026-01-01, so the
/// order of creations and deletions shows in their timestamps as it would on a real apiserver.
fn stamp(rv: u64) -> String {
    let at = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .map(|t| t.to_utc())
        .unwrap_or_default()
        + chrono::Duration::seconds(i64::try_from(rv).unwrap_or(i64::MAX / 2));
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Server-side apply of `patch` (one field manager, forced): its fields replace those there;
/// on the status subresource, its status replaces the status.
fn apply(obj: &mut Value, patch: &Value, status: bool) {
    if status {
        obj["status"] = patch.get("status").cloned().unwrap_or(Value::Null);
    } else {
        merge(obj, patch);
    }
}

/// The apiserver's JSON patch passes a `test` that a path is null when the path is absent
/// (kube-runtime's finalizer helper relies on it for an object without finalizers); the
/// `json-patch` crate fails it, so such tests are dropped before the patch is applied.
fn absent_is_null(obj: &Value, patch: json_patch::Patch) -> json_patch::Patch {
    json_patch::Patch(
        patch
            .0
            .into_iter()
            .filter(|op| match op {
                json_patch::PatchOperation::Test(t) => {
                    !(t.value.is_null() && obj.pointer(t.path.as_str()).is_none())
                }
                _ => true,
            })
            .collect(),
    )
}

/// `/apis/<group>/<version>[/namespaces/<ns>]/<plural>` of `K`.
fn collection_path<K: kube::Resource<DynamicType = ()>>(namespace: Option<&str>) -> String {
    let group = K::group(&());
    let prefix = if group.is_empty() {
        format!("/api/{}", K::version(&()))
    } else {
        format!("/apis/{group}/{}", K::version(&()))
    };
    match namespace {
        Some(ns) => format!("{prefix}/namespaces/{ns}/{}", K::plural(&())),
        None => format!("{prefix}/{}", K::plural(&())),
    }
}

#[test]
fn a_merge_patch_removes_nulls_and_replaces_the_rest() {
    let mut v = json!({"a": 1, "b": {"c": 2, "d": 3}});
    merge(&mut v, &json!({"a": null, "b": {"c": 5}, "e": [1]}));
    assert_eq!(v, json!({"b": {"c": 5, "d": 3}, "e": [1]}));
}

#[test]
fn a_label_selector_is_read_from_the_lists_query_as_a_client_encodes_it() {
    let params = kube::api::ListParams::default().labels("a.b/purpose=drain,node=0f12");
    let query = format!(
        "labelSelector={}",
        form_urlencoded_value(params.label_selector.as_deref().unwrap_or_default())
    );
    assert_eq!(
        label_selector(&format!("limit=5&{query}")),
        [
            ("a.b/purpose".to_owned(), "drain".to_owned()),
            ("node".to_owned(), "0f12".to_owned())
        ]
    );
    assert!(label_selector("limit=5").is_empty());
}

/// `v` as a query value (what the client sends).
fn form_urlencoded_value(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}
