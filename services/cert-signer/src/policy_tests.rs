use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

use super::*;

fn node_params(node: &str, sans: &[&str]) -> CertificateParams {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("valid SAN strings");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
    params
}

fn csr(params: &CertificateParams) -> String {
    let key = KeyPair::generate().expect("key");
    params.serialize_request(&key).expect("csr").pem().expect("pem")
}

fn policy() -> Policy {
    Policy::new("cluster.local", &["10.96.0.1".parse().expect("ip"), "api.example".parse().expect("dns")])
}

#[test]
fn a_plain_node_request_is_approved_with_its_sans() {
    let approved = policy()
        .check(
            Profile::Serving,
            "node-1",
            &csr(&node_params("node-1", &["node-1", "10.0.0.5", "NODE-1.local"])),
        )
        .expect("approved");
    assert_eq!(approved.node, "node-1");
    assert_eq!(
        approved.sans,
        vec![
            San::Dns("node-1".into()),
            San::Dns("node-1.local".into()),
            San::Ip("10.0.0.5".parse().expect("ip"))
        ]
    );
}

#[test]
fn client_profile_accepts_no_sans_and_client_auth_only() {
    let mut params = node_params("n1", &[]);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    policy().check(Profile::Client, "n1", &csr(&params)).expect("approved");
    let err = policy().check(Profile::Client, "n1", &csr(&node_params("n1", &["n1"]))).expect_err("SAN");
    assert!(matches!(err, Error::ForbiddenSan { .. }), "{err}");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let err = policy().check(Profile::Client, "n1", &csr(&params)).expect_err("serverAuth");
    assert!(matches!(err, Error::UsageNotAllowed { .. }), "{err}");
}

#[test]
fn subject_of_another_node_or_group_is_denied() {
    let err = policy().check(Profile::Serving, "n1", &csr(&node_params("n2", &[]))).expect_err("other node");
    assert!(matches!(err, Error::SubjectMismatch { .. }), "{err}");
    let mut params = node_params("n1", &[]);
    params.distinguished_name.remove(DnType::OrganizationName);
    params.distinguished_name.push(DnType::OrganizationName, "system:masters");
    let err = policy().check(Profile::Serving, "n1", &csr(&params)).expect_err("masters");
    assert!(err.to_string().contains("system:masters"), "{err}");
    let mut params = node_params("n1", &[]);
    params.distinguished_name.push(DnType::OrganizationalUnitName, "extra");
    assert!(matches!(
        policy().check(Profile::Serving, "n1", &csr(&params)),
        Err(Error::SubjectMismatch { .. })
    ));
}

#[test]
fn api_server_names_and_wildcards_are_denied() {
    for san in [
        "kubernetes",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "10.96.0.1",
        "api.example",
    ] {
        let err = policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &[san]))).expect_err(san);
        assert!(matches!(err, Error::ForbiddenSan { .. }), "{san}: {err}");
    }
    let err =
        policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &["*.nodes.local"]))).expect_err("*");
    assert!(err.to_string().contains("wildcard"), "{err}");
}

#[test]
fn at_most_sixteen_sans() {
    let sans: Vec<String> = (0..17).map(|i| format!("10.0.0.{i}")).collect();
    let refs: Vec<&str> = sans.iter().map(String::as_str).collect();
    let err = policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &refs))).expect_err("17");
    assert!(matches!(err, Error::TooManySans { count: 17, max: 16 }), "{err}");
    policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &refs[..16]))).expect("16 is fine");
}

#[test]
fn ca_requests_and_foreign_usages_are_denied() {
    let mut params = node_params("n1", &[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    assert!(matches!(policy().check(Profile::Serving, "n1", &csr(&params)), Err(Error::CaRequested)));
    let mut params = node_params("n1", &[]);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign];
    assert!(matches!(policy().check(Profile::Serving, "n1", &csr(&params)), Err(Error::CaRequested)));
    let mut params = node_params("n1", &[]);
    params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::CodeSigning];
    assert!(matches!(
        policy().check(Profile::Serving, "n1", &csr(&params)),
        Err(Error::UsageNotAllowed { .. })
    ));
}

#[test]
fn non_ip_non_dns_sans_and_unknown_extensions_are_denied() {
    let mut params = node_params("n1", &[]);
    params.subject_alt_names = vec![SanType::URI("spiffe://cluster/ns/x".try_into().expect("ia5"))];
    assert!(matches!(policy().check(Profile::Serving, "n1", &csr(&params)), Err(Error::ForbiddenSan { .. })));
    let mut params = node_params("n1", &[]);
    params.custom_extensions =
        vec![rcgen::CustomExtension::from_oid_content(&[1, 2, 3, 4], vec![0x05, 0x00])];
    let err = policy().check(Profile::Serving, "n1", &csr(&params)).expect_err("unknown extension");
    assert!(matches!(&err, Error::ExtensionNotAllowed { oid } if oid == "1.2.3.4"), "{err}");
}

#[test]
fn malformed_input_is_an_invalid_argument() {
    let good = csr(&node_params("n1", &[]));
    for (node, pem) in [
        ("n1", "not a pem at all".to_owned()),
        ("n1", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_owned()),
        ("n1", good.replace("CERTIFICATE REQUEST", "CERTIFICATE")),
        ("N1", good.clone()),
        ("", good.clone()),
        ("n_1", good.clone()),
    ] {
        let err = policy().check(Profile::Serving, node, &pem).expect_err("malformed");
        assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument, "{node:?} {pem}");
    }
}

#[test]
fn a_tampered_csr_fails_signature_verification() {
    let good = csr(&node_params("n1", &["n1"]));
    let (_, pem) = x509_parser::pem::parse_x509_pem(good.as_bytes()).expect("pem");
    let mut der = pem.contents;
    let last = der.len() - 1;
    der[last] ^= 0x01;
    let tampered = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", der));
    assert!(matches!(policy().check(Profile::Serving, "n1", &tampered), Err(Error::BadCsrSignature)));
}

#[test]
fn rsa_keys_below_2048_bits_are_refused_and_2048_accepted() {
    // Made once with `openssl req -new -newkey rsa:BITS -nodes -subj /CN=system:node:n1/O=system:nodes`.
    let small = include_str!("../tests/fixtures/rsa1024-n1.csr");
    let err = policy().check(Profile::Serving, "n1", small).expect_err("1024-bit RSA");
    assert!(matches!(&err, Error::UnsupportedKey(m) if m.contains("1024")), "{err}");
    let approved = policy()
        .check(Profile::Serving, "n1", include_str!("../tests/fixtures/rsa2048-n1.csr"))
        .expect("2048");
    assert!(approved.rsa);
}

#[test]
fn loopback_unspecified_and_localhost_are_denied_in_every_form() {
    for san in [
        "localhost",
        "LOCALHOST",
        "a.localhost",
        "localhost.localdomain",
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "0.0.0.0",
        "::",
        "::ffff:127.0.0.1",
    ] {
        let err = policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &[san]))).expect_err(san);
        assert!(
            matches!(&err, Error::ForbiddenSan { reason, .. } if reason.contains("loopback")),
            "{san}: {err}"
        );
    }
    // A node's own address and name still pass.
    policy().check(Profile::Serving, "n1", &csr(&node_params("n1", &["n1", "10.1.2.3"]))).expect("approved");
}
