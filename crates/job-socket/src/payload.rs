//! The payload codec for the gRPC `bytes payload` field (`encodeMigrationPayload` /
//! `decodeMigrationPayload`).

use crate::json::Json;

/// The UTF-8 of the payload's `JSON.stringify`; no payload (`undefined`) is carried as `null` so
/// the bytes are always valid JSON.
pub fn encode_migration_payload(payload: Option<&Json>) -> Vec<u8> {
    match payload {
        Some(p) => p.to_json_string().into_bytes(),
        None => b"null".to_vec(),
    }
}

/// Empty or absent bytes read as `null`; otherwise the bytes are decoded as `TextDecoder` does
/// (invalid UTF-8 replaced by U+FFFD per maximal subpart, exactly one leading BOM dropped) and
/// parsed; text that is not JSON comes back as the string itself, so a foreign Manager's opaque
/// payload still reaches the job.
pub fn decode_migration_payload(bytes: Option<&[u8]>) -> Json {
    let Some(bytes) = bytes.filter(|b| !b.is_empty()) else {
        return Json::Null;
    };
    let text = String::from_utf8_lossy(bytes);
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    Json::parse(text).unwrap_or_else(|_| Json::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_payload_is_null_both_ways() {
        assert_eq!(encode_migration_payload(None), b"null");
        assert_eq!(decode_migration_payload(None), Json::Null);
        assert_eq!(decode_migration_payload(Some(b"")), Json::Null);
    }

    #[test]
    fn one_bom_is_stripped_and_non_json_comes_back_as_text() {
        assert_eq!(
            decode_migration_payload(Some(b"\xef\xbb\xbf[1]")).to_json_string(),
            "[1]"
        );
        assert_eq!(
            decode_migration_payload(Some(b"\xef\xbb\xbf\xef\xbb\xbf1")),
            Json::from("\u{feff}1")
        );
        assert_eq!(
            decode_migration_payload(Some(b"a\xffb")),
            Json::from("a\u{fffd}b")
        );
    }
}
