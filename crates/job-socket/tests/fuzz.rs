//! Property tests over arbitrary input (the fuzzing requirement, as proptest): frame and
//! path parsing never panic, and parse → serialise → parse is stable.

use job_socket::frame::{Parsed, parse_job_to_worker, parse_worker_to_job};
use job_socket::json::Json;
use job_socket::path::{job_socket_path, parse_job_socket_path};
use proptest::prelude::*;

fn json_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>().prop_map(|f| if f.is_finite() {
            format!("{f:e}")
        } else {
            "1e400".to_owned()
        }),
        "[a-z\\\\\"]{0,6}".prop_map(|s| format!("{:?}", s)),
        Just("\"\\ud800\"".to_owned()),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(("(__proto__|type|payload|[a-z0-9]{1,3})", inner), 0..5)
                .prop_map(|v| {
                    let body: Vec<String> =
                        v.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", body.join(","))
                }),
        ]
    })
}

fn frame_text() -> impl Strategy<Value = String> {
    let ty = prop_oneof![
        Just("hello"),
        Just("state"),
        Just("state-refused"),
        Just("target-ready"),
        Just("source-stopped-output"),
        Just("target-applied"),
        Just("abort"),
        Just("hello-ack"),
        Just("get-state"),
        Just("initial-state"),
        Just("cutover-ready"),
        Just("cutover-apply"),
    ];
    let key = prop_oneof![
        Just("token"),
        Just("payload"),
        Just("reason"),
        Just("migrationId"),
        Just("applied"),
        Just("failed"),
        Just("skewMs"),
        Just("migration"),
        Just("x"),
    ];
    (ty, prop::collection::vec((key, json_text()), 0..5)).prop_map(|(ty, fields)| {
        let mut parts = vec![format!("\"type\":\"{ty}\"")];
        parts.extend(fields.into_iter().map(|(k, v)| format!("\"{k}\":{v}")));
        format!("{{{}}}", parts.join(","))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_text_never_panics_the_frame_or_path_parsers(s in any::<String>()) {
        let _ = parse_job_to_worker(&s);
        let _ = parse_worker_to_job(&s);
        let _ = parse_job_socket_path(&s);
        let _ = Json::parse(&s);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_payload_decoder(b in prop::collection::vec(any::<u8>(), 0..64)) {
        let v = job_socket::payload::decode_migration_payload(Some(&b));
        let _ = v.to_json_string();
    }

    #[test]
    fn parsed_frames_reserialise_to_the_same_frame(s in frame_text()) {
        if let Parsed::Ok(f) = parse_job_to_worker(&s) {
            prop_assert_eq!(parse_job_to_worker(&f.to_text()), Parsed::Ok(f));
        }
        if let Parsed::Ok(f) = parse_worker_to_job(&s) {
            prop_assert_eq!(parse_worker_to_job(&f.to_text()), Parsed::Ok(f));
        }
    }

    #[test]
    fn json_printing_is_a_fixed_point_of_parsing(s in json_text()) {
        if let Ok(v) = Json::parse(&s) {
            let once = v.to_json_string();
            let twice = Json::parse(&once).map(|w| w.to_json_string());
            prop_assert_eq!(Ok(once), twice);
        }
    }

    #[test]
    fn numbers_parse_to_the_correctly_rounded_double(
        neg in any::<bool>(),
        int in "(0|[1-9][0-9]{0,17})",
        frac in proptest::option::of("[0-9]{1,12}"),
        exp in proptest::option::of(-330i32..330),
    ) {
        let mut text = format!("{}{int}", if neg { "-" } else { "" });
        if let Some(f) = frac { text.push('.'); text.push_str(&f); }
        if let Some(e) = exp { text.push_str(&format!("e{e}")); }
        let expected: f64 = text.parse().expect("valid literal");
        match Json::parse(&text) {
            Ok(Json::Number(n)) => prop_assert_eq!(n.to_bits(), expected.to_bits(), "{}", text),
            other => prop_assert!(false, "{text} parsed as {other:?}"),
        }
    }

    #[test]
    fn paths_round_trip_through_encoding(job in "\\PC{1,12}", role in "\\PC{1,12}") {
        let p = parse_job_socket_path(&job_socket_path(&job, &role)).expect("an encoded path parses");
        prop_assert_eq!((p.job_id, p.role), (job, role));
    }

    #[test]
    fn any_accepted_path_reencodes_to_an_equal_path(s in "/instances/[a-zA-Z0-9%/+?#._~-]{0,24}") {
        if let Some(p) = parse_job_socket_path(&s) {
            let again = parse_job_socket_path(&job_socket_path(&p.job_id, &p.role));
            prop_assert_eq!(again, Some(p));
        }
    }
}
