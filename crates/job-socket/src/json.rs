//! JSON values with JavaScript semantics: what `JSON.parse` builds and `JSON.stringify` prints.
//!
//! The job socket's reference implementation is JavaScript, and its outputs are the contract, so
//! this module reproduces the parts of the JS data model that show on the wire:
//!
//! * strings are UTF-16 and may hold lone surrogates (`"\ud800"` parses); [`JsString`] keeps the
//!   common well-formed case as a Rust `String` and falls back to UTF-16 code units only then;
//! * numbers are `f64`: `1e400` parses to `Infinity` (which `JSON.stringify` prints as `null`),
//!   huge integers lose precision, `-0` prints as `0`, and printing follows `Number::toString`
//!   (`1e+21`, `1e-7`, `12345678901234567000`);
//! * objects keep insertion order, a duplicate key keeps its first position and its last value,
//!   and printing puts array-index keys (`"0"` … `"4294967294"`) first in ascending order, as V8's
//!   property order does;
//! * no nesting limit: parsing, printing, comparing, cloning and dropping are all iterative, so a
//!   64 KiB frame of `[[[[…` (32 k levels) is handled on any thread's stack. (serde_json's default
//!   limit is 128; the reference has none.)

use std::collections::HashMap;
use std::fmt;

/// A JavaScript string: UTF-16 code units that need not be well formed.
///
/// Invariants (so equality and hashing can be derived): a well-formed string of at most
/// 22 bytes is stored inline (most keys: no allocation), a longer one on the heap, and
/// the UTF-16 form is used only when the units are *not* valid UTF-16.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JsString(Repr);

const INLINE: usize = 22;

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Inline(u8, [u8; INLINE]),
    Heap(Box<str>),
    Utf16(Box<[u16]>),
}

impl Default for JsString {
    fn default() -> Self {
        Self(Repr::Inline(0, [0; INLINE]))
    }
}

impl JsString {
    fn from_str_ref(s: &str) -> Self {
        if s.len() <= INLINE {
            let mut buf = [0u8; INLINE];
            if let Some(dst) = buf.get_mut(..s.len()) {
                dst.copy_from_slice(s.as_bytes());
            }
            Self(Repr::Inline(u8::try_from(s.len()).unwrap_or(0), buf))
        } else {
            Self(Repr::Heap(Box::from(s)))
        }
    }

    fn from_string(s: String) -> Self {
        if s.len() <= INLINE {
            Self::from_str_ref(&s)
        } else {
            Self(Repr::Heap(s.into_boxed_str()))
        }
    }

    /// A string from UTF-16 code units, lone surrogates allowed.
    pub fn from_utf16(units: Vec<u16>) -> Self {
        match String::from_utf16(&units) {
            Ok(s) => Self::from_string(s),
            Err(_) => Self(Repr::Utf16(units.into_boxed_slice())),
        }
    }

    /// The string when it is well formed (every string a Rust caller builds is).
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Repr::Inline(len, buf) => buf
                .get(..usize::from(*len))
                .and_then(|b| std::str::from_utf8(b).ok()),
            Repr::Heap(s) => Some(s),
            Repr::Utf16(_) => None,
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Repr::Inline(len, buf) => buf.get(..usize::from(*len)),
            Repr::Heap(s) => Some(s.as_bytes()),
            Repr::Utf16(_) => None,
        }
    }

    /// The string with each lone surrogate replaced by U+FFFD.
    pub fn to_string_lossy(&self) -> std::borrow::Cow<'_, str> {
        match &self.0 {
            Repr::Utf16(u) => std::borrow::Cow::Owned(String::from_utf16_lossy(u)),
            _ => std::borrow::Cow::Borrowed(self.as_str().unwrap_or_default()),
        }
    }

    /// The UTF-16 code units, as JavaScript sees the string.
    pub fn to_utf16(&self) -> Vec<u16> {
        match &self.0 {
            Repr::Utf16(u) => u.to_vec(),
            _ => self.as_str().unwrap_or_default().encode_utf16().collect(),
        }
    }

    /// Whether the string is well formed (no lone surrogate).
    pub fn is_well_formed(&self) -> bool {
        !matches!(self.0, Repr::Utf16(_))
    }

    /// Whether V8 orders this key as an array index: the canonical decimal form of an integer in
    /// `0..=2^32-2`.
    pub fn is_array_index(&self) -> bool {
        self.as_str().and_then(array_index).is_some()
    }
}

fn array_index(key: &str) -> Option<u32> {
    let b = key.as_bytes();
    if b.is_empty() || b.len() > 10 || (b.len() > 1 && b[0] == b'0') {
        return None;
    }
    if !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v: u64 = key.parse().ok()?;
    if v <= u64::from(u32::MAX - 1) {
        u32::try_from(v).ok()
    } else {
        None
    }
}

impl From<&str> for JsString {
    fn from(s: &str) -> Self {
        Self::from_str_ref(s)
    }
}
impl From<String> for JsString {
    fn from(s: String) -> Self {
        Self::from_string(s)
    }
}
impl PartialEq<str> for JsString {
    fn eq(&self, other: &str) -> bool {
        self.bytes() == Some(other.as_bytes())
    }
}
impl PartialEq<&str> for JsString {
    fn eq(&self, other: &&str) -> bool {
        self.bytes() == Some(other.as_bytes())
    }
}
impl fmt::Debug for JsString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        write_js_string(&mut out, self);
        f.write_str(&out)
    }
}
impl fmt::Display for JsString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

/// A JSON object: entries in insertion order, keys unique.
#[derive(Default, Clone)]
pub struct JsObject {
    entries: Vec<(JsString, Json)>,
}

impl JsObject {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` as JavaScript assignment does: an existing key keeps its position.
    /// Linear in the object's size; meant for the small objects callers build by hand.
    pub fn insert(&mut self, key: impl Into<JsString>, value: Json) {
        let key = key.into();
        if let Some(slot) = self.entries.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
        } else {
            self.entries.push((key, value));
        }
    }

    /// The value under `key`.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Entries in insertion order (not the order `JSON.stringify` prints; see [`Self::iter_js_order`]).
    pub fn iter(&self) -> impl Iterator<Item = (&JsString, &Json)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// Entries in the order JavaScript enumerates them: array-index keys ascending, then the rest
    /// in insertion order.
    pub fn iter_js_order(&self) -> Vec<(&JsString, &Json)> {
        let mut idx: Vec<(u32, &JsString, &Json)> = Vec::new();
        let mut rest = Vec::with_capacity(self.entries.len());
        for (k, v) in &self.entries {
            match k.as_str().and_then(array_index) {
                Some(i) => idx.push((i, k, v)),
                None => rest.push((k, v)),
            }
        }
        if idx.is_empty() {
            return rest;
        }
        idx.sort_by_key(|e| e.0);
        idx.into_iter()
            .map(|(_, k, v)| (k, v))
            .chain(rest)
            .collect()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes and returns the value under `key`.
    pub fn take(&mut self, key: &str) -> Option<Json> {
        let at = self.entries.iter().position(|(k, _)| *k == key)?;
        Some(self.entries.remove(at).1)
    }

    fn retain_keys(&mut self, keep: impl Fn(&JsString) -> bool) {
        self.entries.retain(|(k, _)| keep(k));
    }
}

impl PartialEq for JsObject {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter_js_order()
                .into_iter()
                .zip(other.iter_js_order())
                .all(|((ka, va), (kb, vb))| ka == kb && va == vb)
    }
}

impl fmt::Debug for JsObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        write_object(&mut out, self);
        f.write_str(&out)
    }
}

fn write_object(out: &mut String, o: &JsObject) {
    // An object is printed through a temporary value so the one iterative printer is used.
    let v = Json::Object(o.clone());
    stringify_into(out, &v);
}

/// A JSON value as JavaScript holds it after `JSON.parse`.
#[derive(Default)]
pub enum Json {
    /// `null`
    #[default]
    Null,
    /// `true` / `false`
    Bool(bool),
    /// A number; may be non-finite after parsing `1e400` (printed as `null`).
    Number(f64),
    /// A string.
    String(JsString),
    /// An array.
    Array(Vec<Json>),
    /// An object.
    Object(JsObject),
}

impl From<&str> for Json {
    fn from(s: &str) -> Self {
        Json::String(s.into())
    }
}
impl From<String> for Json {
    fn from(s: String) -> Self {
        Json::String(s.into())
    }
}
impl From<f64> for Json {
    fn from(n: f64) -> Self {
        Json::Number(n)
    }
}
impl From<bool> for Json {
    fn from(b: bool) -> Self {
        Json::Bool(b)
    }
}

impl Drop for Json {
    // The derived drop recurses once per nesting level; a 32 k-deep frame would overflow a
    // 2 MiB tokio worker stack. Children are moved onto a heap stack instead.
    fn drop(&mut self) {
        fn nested(v: &Json) -> bool {
            matches!(v, Json::Array(a) if !a.is_empty())
                || matches!(v, Json::Object(o) if !o.is_empty())
        }
        // A container of leaves drops normally (one level deep); only deeper ones are flattened.
        let mut stack: Vec<Json> = match self {
            Json::Array(v) if v.iter().any(nested) => std::mem::take(v),
            Json::Object(o) if o.entries.iter().any(|(_, v)| nested(v)) => {
                std::mem::take(&mut o.entries)
                    .into_iter()
                    .map(|(_, v)| v)
                    .collect()
            }
            _ => return,
        };
        while let Some(mut node) = stack.pop() {
            match &mut node {
                Json::Array(v) if v.iter().any(nested) => stack.append(v),
                Json::Object(o) if o.entries.iter().any(|(_, v)| nested(v)) => {
                    stack.extend(std::mem::take(&mut o.entries).into_iter().map(|(_, v)| v));
                }
                _ => {}
            }
        }
    }
}

impl Clone for Json {
    fn clone(&self) -> Self {
        enum Task<'a> {
            Visit(&'a Json),
            Array(usize),
            Object(Vec<JsString>),
        }
        let mut tasks = vec![Task::Visit(self)];
        let mut out: Vec<Json> = Vec::new();
        while let Some(t) = tasks.pop() {
            match t {
                Task::Visit(Json::Array(v)) => {
                    tasks.push(Task::Array(v.len()));
                    tasks.extend(v.iter().rev().map(Task::Visit));
                }
                Task::Visit(Json::Object(o)) => {
                    tasks.push(Task::Object(
                        o.entries.iter().map(|(k, _)| k.clone()).collect(),
                    ));
                    tasks.extend(o.entries.iter().rev().map(|(_, v)| Task::Visit(v)));
                }
                Task::Visit(Json::Null) => out.push(Json::Null),
                Task::Visit(Json::Bool(b)) => out.push(Json::Bool(*b)),
                Task::Visit(Json::Number(n)) => out.push(Json::Number(*n)),
                Task::Visit(Json::String(s)) => out.push(Json::String(s.clone())),
                Task::Array(n) => {
                    let items = out.split_off(out.len().saturating_sub(n));
                    out.push(Json::Array(items));
                }
                Task::Object(keys) => {
                    let values = out.split_off(out.len().saturating_sub(keys.len()));
                    out.push(Json::Object(JsObject {
                        entries: keys.into_iter().zip(values).collect(),
                    }));
                }
            }
        }
        out.pop().unwrap_or_default()
    }
}

impl PartialEq for Json {
    /// Structural equality as JavaScript can observe it (numbers by `==`, object entries in
    /// enumeration order). Iterative.
    fn eq(&self, other: &Self) -> bool {
        let mut stack = vec![(self, other)];
        while let Some(pair) = stack.pop() {
            match pair {
                (Json::Null, Json::Null) => {}
                (Json::Bool(a), Json::Bool(b)) if a == b => {}
                (Json::Number(a), Json::Number(b)) if a == b => {}
                (Json::String(a), Json::String(b)) if a == b => {}
                (Json::Array(a), Json::Array(b)) if a.len() == b.len() => {
                    stack.extend(a.iter().zip(b))
                }
                (Json::Object(a), Json::Object(b)) if a.len() == b.len() => {
                    // Compared in the order JavaScript enumerates them: that order is observable,
                    // insertion order among array-index keys is not.
                    for ((ka, va), (kb, vb)) in a.iter_js_order().into_iter().zip(b.iter_js_order())
                    {
                        if ka != kb {
                            return false;
                        }
                        stack.push((va, vb));
                    }
                }
                _ => return false,
            }
        }
        true
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json_string())
    }
}

impl Json {
    /// `JSON.parse(text)`: strict RFC 8259 JSON (no BOM, no trailing commas, whitespace limited to
    /// space, tab, CR and LF), with JavaScript's value semantics described in the module docs.
    pub fn parse(text: &str) -> Result<Json, JsonError> {
        Parser::new(text).parse().map(|(v, _)| v)
    }

    /// [`Self::parse`], also reporting what validation may need to walk the tree for.
    pub(crate) fn parse_flagged(text: &str) -> Result<(Json, ParseFlags), JsonError> {
        Parser::new(text).parse()
    }

    /// `JSON.stringify(value)`, byte for byte as V8 prints it.
    pub fn to_json_string(&self) -> String {
        let mut out = String::new();
        stringify_into(&mut out, self);
        out
    }

    /// Whether `zod`'s `z.json()` accepts the value: every number finite.
    pub fn is_zod_json(&self) -> bool {
        let mut stack = vec![self];
        while let Some(v) = stack.pop() {
            match v {
                Json::Number(n) if !n.is_finite() => return false,
                Json::Array(a) => stack.extend(a.iter()),
                Json::Object(o) => stack.extend(o.entries.iter().map(|(_, v)| v)),
                _ => {}
            }
        }
        true
    }

    /// Drops every `__proto__` key at every depth, as `z.json()`'s record rebuild does (assigning
    /// `out["__proto__"]` sets the prototype rather than creating a property).
    pub fn strip_proto_keys(&mut self) {
        let mut stack = vec![self];
        while let Some(v) = stack.pop() {
            match v {
                Json::Array(a) => stack.extend(a.iter_mut()),
                Json::Object(o) => {
                    o.retain_keys(|k| *k != "__proto__");
                    stack.extend(o.entries.iter_mut().map(|(_, v)| v));
                }
                _ => {}
            }
        }
    }

    /// Whether any object at any depth has a `__proto__` key.
    pub fn has_proto_key(&self) -> bool {
        let mut stack = vec![self];
        while let Some(v) = stack.pop() {
            match v {
                Json::Array(a) => stack.extend(a.iter()),
                Json::Object(o) => {
                    if o.entries.iter().any(|(k, _)| *k == "__proto__") {
                        return true;
                    }
                    stack.extend(o.entries.iter().map(|(_, v)| v));
                }
                _ => {}
            }
        }
        false
    }

    /// The JavaScript type name zod reports as `received …`.
    pub fn js_type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    /// The object, if this is one.
    pub fn as_object(&self) -> Option<&JsObject> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_js_string(&self) -> Option<&JsString> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }
}

/// `JSON.parse` refused the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not valid JSON at byte {offset}: {what}")]
pub struct JsonError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

/// What the parser noticed, so validation can skip whole-tree walks in the common case.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ParseFlags {
    /// Some object has a `__proto__` key.
    pub proto_key: bool,
    /// Some number overflowed to ±Infinity.
    pub non_finite: bool,
}

/// An open container: where its children start in the parser's scratch `values`.
enum Open {
    Array(usize),
    Object(usize),
}

struct Parser<'a> {
    b: &'a [u8],
    s: &'a str,
    i: usize,
    // Children of every open container, on shared stacks (array items in `values`, object
    // entries in `pairs`, each open object's pending key in `keys`); a container's children are
    // moved into an exactly-sized Vec when it closes, so nothing is reallocated while it grows.
    values: Vec<Json>,
    pairs: Vec<(JsString, Json)>,
    keys: Vec<JsString>,
    flags: ParseFlags,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            b: text.as_bytes(),
            s: text,
            i: 0,
            values: Vec::new(),
            pairs: Vec::new(),
            keys: Vec::new(),
            flags: ParseFlags::default(),
        }
    }

    fn err(&self, what: &'static str) -> JsonError {
        JsonError {
            offset: self.i,
            what,
        }
    }

    fn ws(&mut self) {
        while let Some(c) = self.b.get(self.i) {
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn parse(mut self) -> Result<(Json, ParseFlags), JsonError> {
        let mut stack: Vec<Open> = Vec::new();
        'value: loop {
            self.ws();
            let c = *self
                .b
                .get(self.i)
                .ok_or_else(|| self.err("unexpected end"))?;
            let mut value = match c {
                b'{' => {
                    self.i += 1;
                    self.ws();
                    if self.b.get(self.i) == Some(&b'}') {
                        self.i += 1;
                        Json::Object(JsObject::new())
                    } else {
                        let key = self.key()?;
                        stack.push(Open::Object(self.pairs.len()));
                        self.keys.push(key);
                        continue 'value;
                    }
                }
                b'[' => {
                    self.i += 1;
                    self.ws();
                    if self.b.get(self.i) == Some(&b']') {
                        self.i += 1;
                        Json::Array(Vec::new())
                    } else {
                        stack.push(Open::Array(self.values.len()));
                        continue 'value;
                    }
                }
                b'"' => Json::String(self.string()?),
                b't' => self.literal(b"true", Json::Bool(true))?,
                b'f' => self.literal(b"false", Json::Bool(false))?,
                b'n' => self.literal(b"null", Json::Null)?,
                b'-' | b'0'..=b'9' => Json::Number(self.number()?),
                _ => return Err(self.err("unexpected character")),
            };
            // Attach the finished value to its parent, closing as many containers as end here.
            loop {
                let Some(top) = stack.last() else {
                    self.ws();
                    if self.i != self.b.len() {
                        return Err(self.err("trailing characters"));
                    }
                    return Ok((value, self.flags));
                };
                match top {
                    Open::Array(_) => self.values.push(value),
                    Open::Object(_) => {
                        let key = self.keys.pop().unwrap_or_default();
                        self.pairs.push((key, value));
                    }
                }
                self.ws();
                match (top, self.b.get(self.i)) {
                    (Open::Array(_), Some(b',')) => {
                        self.i += 1;
                        continue 'value;
                    }
                    (Open::Object(_), Some(b',')) => {
                        self.i += 1;
                        self.ws();
                        let key = self.key()?;
                        self.keys.push(key);
                        continue 'value;
                    }
                    (Open::Array(start), Some(b']')) => {
                        let start = *start;
                        self.i += 1;
                        stack.pop();
                        value = Json::Array(self.values.drain(start..).collect());
                    }
                    (Open::Object(start), Some(b'}')) => {
                        let start = *start;
                        self.i += 1;
                        stack.pop();
                        value = Json::Object(self.close_object(start));
                    }
                    (Open::Array(_), _) => return Err(self.err("expected , or ]")),
                    (Open::Object(_), _) => return Err(self.err("expected , or }")),
                }
            }
        }
    }

    fn close_object(&mut self, start: usize) -> JsObject {
        let entries: Vec<(JsString, Json)> = self.pairs.drain(start..).collect();
        let n = entries.len();
        let duplicated = if n <= INDEX_AFTER {
            entries
                .iter()
                .enumerate()
                .any(|(i, (k, _))| entries.iter().take(i).any(|(e, _)| e == k))
        } else {
            let mut seen = std::collections::HashSet::with_capacity(n);
            !entries.iter().all(|(k, _)| seen.insert(k))
        };
        if !duplicated {
            return JsObject { entries };
        }
        // Duplicate keys: the last value wins, in the first key's position (CreateDataProperty).
        let mut out: Vec<(JsString, Json)> = Vec::with_capacity(n);
        let mut index: HashMap<JsString, usize> = HashMap::with_capacity(n);
        for (k, v) in entries {
            match index.get(&k).and_then(|&at| out.get_mut(at)) {
                Some(slot) => slot.1 = v,
                None => {
                    index.insert(k.clone(), out.len());
                    out.push((k, v));
                }
            }
        }
        JsObject { entries: out }
    }

    fn key(&mut self) -> Result<JsString, JsonError> {
        if self.b.get(self.i) != Some(&b'"') {
            return Err(self.err("expected a string key"));
        }
        let k = self.string()?;
        if k == "__proto__" {
            self.flags.proto_key = true;
        }
        self.ws();
        if self.b.get(self.i) != Some(&b':') {
            return Err(self.err("expected :"));
        }
        self.i += 1;
        Ok(k)
    }

    fn literal(&mut self, word: &[u8], v: Json) -> Result<Json, JsonError> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("unexpected character"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<f64, JsonError> {
        let start = self.i;
        let neg = self.b.get(self.i) == Some(&b'-');
        if neg {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("bad number")),
        }
        let int_end = self.i;
        let mut frac = (int_end, int_end);
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            let f0 = self.i;
            if self.digits() == 0 {
                return Err(self.err("bad number"));
            }
            frac = (f0, self.i);
        }
        let mut exp: Option<(bool, usize, usize)> = None;
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            let eneg = self.b.get(self.i) == Some(&b'-');
            if matches!(self.b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            let e0 = self.i;
            if self.digits() == 0 {
                return Err(self.err("bad number"));
            }
            exp = Some((eneg, e0, self.i));
        }
        let digits_start = if neg { start + 1 } else { start };
        if let Some(f) = self.fast_number(digits_start, int_end, frac, exp) {
            return Ok(if neg { -f } else { f });
        }
        // Rust's float parser rounds correctly and overflows to infinity, like JS.
        let n = self
            .s
            .get(start..self.i)
            .and_then(|t| t.parse::<f64>().ok())
            .ok_or_else(|| self.err("bad number"))?;
        if !n.is_finite() {
            self.flags.non_finite = true;
        }
        Ok(n)
    }

    /// Clinger's fast path: with at most 15 digits the mantissa is exact in an `f64`, and so is
    /// `10^k` for `k <= 22`, so one multiplication or division is correctly rounded — the same
    /// value the full parser (and JavaScript) gives. `None` sends the number to the full parser.
    fn fast_number(
        &self,
        int: usize,
        int_end: usize,
        frac: (usize, usize),
        exp: Option<(bool, usize, usize)>,
    ) -> Option<f64> {
        const POW10: [f64; 23] = [
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
        ];
        let int_digits = self.b.get(int..int_end)?;
        let frac_digits = self.b.get(frac.0..frac.1)?;
        if int_digits.len() + frac_digits.len() > 15 {
            return None;
        }
        let mut m: u64 = 0;
        for d in int_digits.iter().chain(frac_digits) {
            m = m * 10 + u64::from(d - b'0');
        }
        let mut e: i64 = -i64::try_from(frac_digits.len()).ok()?;
        if let Some((eneg, e0, e1)) = exp {
            let ed = self.b.get(e0..e1)?;
            if ed.len() > 4 {
                return None;
            }
            let mut v: i64 = 0;
            for d in ed {
                v = v * 10 + i64::from(d - b'0');
            }
            e += if eneg { -v } else { v };
        }
        #[allow(clippy::cast_precision_loss)] // m < 10^15 < 2^53: exact
        let m = m as f64;
        let p = *POW10.get(usize::try_from(e.unsigned_abs()).ok()?)?;
        Some(if e >= 0 { m * p } else { m / p })
    }

    fn hex4(&mut self) -> Result<u16, JsonError> {
        let mut v: u16 = 0;
        for _ in 0..4 {
            let c = *self
                .b
                .get(self.i)
                .ok_or_else(|| self.err("bad \\u escape"))?;
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(self.err("bad \\u escape")),
            };
            v = (v << 4) | u16::from(d);
            self.i += 1;
        }
        Ok(v)
    }

    fn string(&mut self) -> Result<JsString, JsonError> {
        self.i += 1; // opening quote
        let start = self.i;
        // Fast path: no escapes.
        loop {
            self.i = skip_plain(self.b, self.i);
            match self.b.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    let s = self
                        .s
                        .get(start..self.i)
                        .ok_or_else(|| self.err("internal: utf8"))?;
                    self.i += 1;
                    return Ok(JsString::from(s));
                }
                Some(b'\\') => break,
                Some(c) if *c < 0x20 => return Err(self.err("control character in string")),
                Some(_) => self.i += 1,
            }
        }
        let mut buf = String::from(
            self.s
                .get(start..self.i)
                .ok_or_else(|| self.err("internal: utf8"))?,
        );
        let mut units: Option<Vec<u16>> = None;
        let push_str = |buf: &mut String, units: &mut Option<Vec<u16>>, s: &str| match units {
            Some(u) => u.extend(s.encode_utf16()),
            None => buf.push_str(s),
        };
        loop {
            let run_start = self.i;
            self.i = skip_plain(self.b, self.i);
            let run = self
                .s
                .get(run_start..self.i)
                .ok_or_else(|| self.err("internal: utf8"))?;
            push_str(&mut buf, &mut units, run);
            match self.b.get(self.i) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(match units {
                        Some(u) => JsString::from_utf16(u),
                        None => JsString::from(buf),
                    });
                }
                Some(b'\\') => {
                    self.i += 1;
                    let e = *self
                        .b
                        .get(self.i)
                        .ok_or_else(|| self.err("unterminated string"))?;
                    self.i += 1;
                    let simple = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let u = self.hex4()?;
                            if (0xD800..0xDC00).contains(&u)
                                && self.b.get(self.i..self.i + 2) == Some(b"\\u")
                            {
                                // A high surrogate escape followed by a low one is one character.
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xDC00..0xE000).contains(&lo) {
                                    let cp = 0x10000
                                        + ((u32::from(u) - 0xD800) << 10)
                                        + (u32::from(lo) - 0xDC00);
                                    let ch = char::from_u32(cp)
                                        .ok_or_else(|| self.err("internal: surrogate"))?;
                                    push_str(&mut buf, &mut units, ch.encode_utf8(&mut [0; 4]));
                                    continue;
                                }
                                self.i = save;
                            }
                            match char::from_u32(u32::from(u)) {
                                Some(ch) => {
                                    push_str(&mut buf, &mut units, ch.encode_utf8(&mut [0; 4]));
                                }
                                None => {
                                    // A lone surrogate: switch to UTF-16 code units.
                                    let u16s =
                                        units.get_or_insert_with(|| buf.encode_utf16().collect());
                                    u16s.push(u);
                                }
                            }
                            continue;
                        }
                        _ => return Err(self.err("bad escape")),
                    };
                    push_str(&mut buf, &mut units, simple.encode_utf8(&mut [0; 4]));
                }
                Some(_) => return Err(self.err("control character in string")),
            }
        }
    }
}

/// The index of the first byte at or after `i` that ends a plain run inside a string (`"`,
/// `\\` or a control character), or `b.len()`. Eight bytes at a time: each test below is
/// non-zero whenever some byte matches (it may also flag a later byte spuriously, which only
/// sends that word to the exact byte loop).
fn skip_plain(b: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    while let Some(chunk) = b.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let x = u64::from_le_bytes(w);
        let special = zero_byte(x ^ (ONES * u64::from(b'"')))
            | zero_byte(x ^ (ONES * u64::from(b'\\')))
            | (x.wrapping_sub(ONES * 0x20) & !x & HIGH);
        if special != 0 {
            break;
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        i += 1;
    }
    i
}

const INDEX_AFTER: usize = 16;

// ── printing ────────────────────────────────────────────────────────────────

fn stringify_into(out: &mut String, v: &Json) {
    enum Task<'a> {
        Value(&'a Json),
        Key(&'a JsString),
        Raw(&'static str),
    }
    let mut tasks = vec![Task::Value(v)];
    while let Some(t) = tasks.pop() {
        match t {
            Task::Raw(s) => out.push_str(s),
            Task::Key(k) => {
                write_js_string(out, k);
                out.push(':');
            }
            Task::Value(v) => match v {
                Json::Null => out.push_str("null"),
                Json::Bool(true) => out.push_str("true"),
                Json::Bool(false) => out.push_str("false"),
                Json::Number(n) => write_js_number(out, *n),
                Json::String(s) => write_js_string(out, s),
                Json::Array(a) => {
                    out.push('[');
                    tasks.push(Task::Raw("]"));
                    for (i, item) in a.iter().enumerate().rev() {
                        tasks.push(Task::Value(item));
                        if i > 0 {
                            tasks.push(Task::Raw(","));
                        }
                    }
                }
                Json::Object(o) => {
                    out.push('{');
                    tasks.push(Task::Raw("}"));
                    let entries = o.iter_js_order();
                    for (i, (k, item)) in entries.into_iter().enumerate().rev() {
                        tasks.push(Task::Value(item));
                        tasks.push(Task::Key(k));
                        if i > 0 {
                            tasks.push(Task::Raw(","));
                        }
                    }
                }
            },
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_u_escape(out: &mut String, u: u16) {
    out.push_str("\\u");
    for shift in [12u16, 8, 4, 0] {
        out.push(char::from(HEX[usize::from((u >> shift) & 0xF)]));
    }
}

/// `JSON.stringify` of a string (well-formed variant: lone surrogates become `\udxxx`).
pub fn write_js_string(out: &mut String, s: &JsString) {
    out.push('"');
    match &s.0 {
        Repr::Inline(..) | Repr::Heap(_) => {
            let s = s.as_str().unwrap_or_default();
            // Copy runs of plain bytes; only ASCII bytes ever need escaping.
            let mut run = 0;
            for (i, b) in s.bytes().enumerate() {
                if b < 0x20 || b == b'"' || b == b'\\' {
                    out.push_str(s.get(run..i).unwrap_or_default());
                    escape_ascii(out, b);
                    run = i + 1;
                }
            }
            out.push_str(s.get(run..).unwrap_or_default());
        }
        Repr::Utf16(units) => {
            for r in char::decode_utf16(units.iter().copied()) {
                match r {
                    Ok(c) if c.is_ascii() && (c < ' ' || c == '"' || c == '\\') => {
                        escape_ascii(out, u8::try_from(u32::from(c)).unwrap_or(0));
                    }
                    Ok(c) => out.push(c),
                    Err(e) => push_u_escape(out, e.unpaired_surrogate()),
                }
            }
        }
    }
    out.push('"');
}

fn escape_ascii(out: &mut String, b: u8) {
    match b {
        b'"' => out.push_str("\\\""),
        b'\\' => out.push_str("\\\\"),
        b'\n' => out.push_str("\\n"),
        b'\r' => out.push_str("\\r"),
        b'\t' => out.push_str("\\t"),
        0x08 => out.push_str("\\b"),
        0x0C => out.push_str("\\f"),
        _ => push_u_escape(out, u16::from(b)),
    }
}

/// `Number.prototype.toString()` as `JSON.stringify` uses it; non-finite numbers print `null`.
pub fn write_js_number(out: &mut String, n: f64) {
    use std::fmt::Write as _;
    if !n.is_finite() {
        out.push_str("null");
        return;
    }
    if n == 0.0 {
        out.push('0');
        return;
    }
    if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
        #[allow(clippy::cast_possible_truncation)] // integral and below 2^53: exact
        let i = n as i64;
        let _ = write!(out, "{i}");
        return;
    }
    if n < 0.0 {
        out.push('-');
    }
    // Rust's `{:e}` prints the shortest digits that round-trip, the same digits JS picks.
    let e = format!("{:e}", n.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let k = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let point = exp + 1; // JS's `n`: digits × 10^(n-k)
    if k <= point && point <= 21 {
        out.push_str(&digits);
        for _ in 0..(point - k) {
            out.push('0');
        }
    } else if 0 < point && point <= 21 {
        let (a, b) = digits.split_at(usize::try_from(point).unwrap_or(0));
        out.push_str(a);
        out.push('.');
        out.push_str(b);
    } else if -6 < point && point <= 0 {
        out.push_str("0.");
        for _ in 0..(-point) {
            out.push('0');
        }
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let e = point - 1;
        let _ = write!(out, "e{}{}", if e < 0 { '-' } else { '+' }, e.abs());
    }
}

// ── serde ───────────────────────────────────────────────────────────────────

/// Nesting the serde bridge accepts; deeper values are an error rather than a stack overflow.
/// The wire path ([`Json::parse`] / [`Json::to_json_string`]) has no limit.
pub const SERDE_MAX_DEPTH: usize = 512;

struct Depth<'a>(&'a Json, usize);

impl serde::Serialize for Depth<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeMap, SerializeSeq};
        if self.1 > SERDE_MAX_DEPTH {
            return Err(S::Error::custom(
                "JSON nested too deeply for serde; use Json::to_json_string",
            ));
        }
        match self.0 {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            // Integral values print as integers (as JS does); others as serde's f64.
            #[allow(clippy::cast_possible_truncation)] // integral and below 2^53: exact
            Json::Number(n) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
                s.serialize_i64(*n as i64)
            }
            Json::Number(n) if n.is_finite() => s.serialize_f64(*n),
            Json::Number(_) => s.serialize_unit(),
            Json::String(st) => s.serialize_str(&st.to_string_lossy()),
            Json::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(&Depth(v, self.1 + 1))?;
                }
                seq.end()
            }
            Json::Object(o) => {
                let mut m = s.serialize_map(Some(o.len()))?;
                for (k, v) in o.iter_js_order() {
                    m.serialize_entry(&k.to_string_lossy(), &Depth(v, self.1 + 1))?;
                }
                m.end()
            }
        }
    }
}

impl serde::Serialize for Json {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Depth(self, 0).serialize(s)
    }
}

impl serde::Serialize for JsString {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string_lossy())
    }
}

impl<'de> serde::Deserialize<'de> for JsString {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(JsString::from)
    }
}

impl<'de> serde::Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> serde::de::Visitor<'de> for JsonVisitor {
    type Value = Json;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        serde::Deserialize::deserialize(d)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }
    #[allow(clippy::cast_precision_loss)] // JS numbers are f64
    fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(n as f64))
    }
    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(n as f64))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Json, E> {
        Ok(Json::Number(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.into()))
    }
    fn visit_string<E>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s.into()))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = a.next_element()? {
            v.push(x);
        }
        Ok(Json::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
        let mut o = JsObject::new();
        while let Some((k, v)) = a.next_entry::<String, Json>()? {
            o.insert(k, v);
        }
        Ok(Json::Object(o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(s: &str) -> String {
        Json::parse(s)
            .map(|v| v.to_json_string())
            .unwrap_or_else(|e| format!("ERR {e}"))
    }

    #[test]
    fn numbers_print_like_javascript() {
        assert_eq!(
            rt("[1e21,1e-7,123e-20,0.1,100,1.7976931348623157e308,5e-324,2e-324]"),
            "[1e+21,1e-7,1.23e-18,0.1,100,1.7976931348623157e+308,5e-324,0]"
        );
        assert_eq!(
            rt("[12345678901234567890,-0,1e400,-1e400,0.000001,1e20,123.456,-1.5e-9]"),
            "[12345678901234567000,0,null,null,0.000001,100000000000000000000,123.456,-1.5e-9]"
        );
    }

    #[test]
    fn duplicate_keys_keep_first_position_and_last_value() {
        assert_eq!(rt(r#"{"a":1,"b":2,"a":3}"#), r#"{"a":3,"b":2}"#);
        let many: String = (0..40).map(|i| format!("\"k{i}\":{i},")).collect();
        assert_eq!(
            rt(&format!("{{{many}\"k3\":99}}"))
                .matches("\"k3\":99")
                .count(),
            1
        );
    }

    #[test]
    fn array_index_keys_print_first_in_numeric_order() {
        assert_eq!(
            rt(r#"{"b":1,"10":2,"2":3,"01":4,"4294967295":5,"4294967294":6}"#),
            r#"{"2":3,"10":2,"4294967294":6,"b":1,"01":4,"4294967295":5}"#
        );
    }

    #[test]
    fn lone_surrogates_survive_and_print_escaped() {
        assert_eq!(
            rt(r#"["\ud800","\udc00x","\ud83d\ude00","a\ud800\u0001\""]"#),
            "[\"\\ud800\",\"\\udc00x\",\"😀\",\"a\\ud800\\u0001\\\"\"]"
        );
    }

    #[test]
    fn strict_grammar_rejects_what_json_parse_rejects() {
        for bad in [
            "",
            " ",
            "\u{feff}1",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".1",
            "+1",
            "NaN",
            "'a'",
            "\"\t\"",
            "[",
            "{\"a\"}",
            "1 2",
            "\"\\x\"",
            "\"\\u12\"",
        ] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn deep_nesting_has_no_limit_and_no_stack_overflow() {
        let d = 200_000;
        let text = format!("{}{}", "[".repeat(d), "]".repeat(d));
        let v = Json::parse(&text).expect("deep array parses");
        assert_eq!(v.to_json_string(), text);
        let c = v.clone();
        assert_eq!(c, v);
        drop(c);
        drop(v);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn the_word_at_a_time_scan_stops_where_the_byte_scan_does(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            start in 0usize..40,
        ) {
            let start = start.min(b.len());
            let naive = b.iter().skip(start).position(|&c| c == b'"' || c == b'\\' || c < 0x20).map_or(b.len(), |p| p + start);
            proptest::prop_assert_eq!(skip_plain(&b, start), naive);
        }
    }
}
