//! TLS (rustls) between the client and the sim, with a token.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{WAIT, config, fast};
use manager_client::{ClientError, ManagerClient, TlsOptions};
use manager_sim::Sim;
use manager_sim::config::TlsFiles;

#[tokio::test]
async fn a_client_trusting_the_ca_syncs_over_tls_and_a_plaintext_client_does_not() {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let mut cfg = config();
    cfg.tls = Some(TlsFiles {
        cert_file: cert,
        key_file: key,
    });
    cfg.token = Some("t0ken".into());
    let sim = Sim::start(cfg).await.unwrap();
    assert!(sim.endpoint().starts_with("https://"));

    let tls = TlsOptions {
        ca_pem: ck.cert.pem().into_bytes(),
        domain: Some("localhost".into()),
        identity: None,
    };
    let client = ManagerClient::connect(fast(sim.endpoint()).with_token("t0ken").with_tls(tls))
        .await
        .unwrap();
    client.wait_ready(WAIT).await.unwrap();
    assert_eq!(client.mirror().nodes().len(), 3);

    let plain = ManagerClient::connect(fast(format!("http://{}", sim.addr().expect("served"))))
        .await
        .unwrap();
    let err = plain.list_pools().await.unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Unavailable(_) | ClientError::Rpc { .. } | ClientError::Timeout(_)
        ),
        "{err}"
    );
    plain.close().await;
    client.close().await;
}
