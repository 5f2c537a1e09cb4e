//! Reading a CA signing key from PEM. ring (our only crypto backend) reads PKCS#8 alone, but
//! plugged-in Istio CAs often hold what `openssl` writes: PKCS#1 `RSA PRIVATE KEY` (Istio's own
//! `samples/certs/ca-key.pem`) or SEC1 `EC PRIVATE KEY`. Those are wrapped into PKCS#8 here.

use rcgen::KeyPair;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

/// `AlgorithmIdentifier { rsaEncryption, NULL }`.
const RSA_ALGORITHM: &[u8] = &[
    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];
/// `AlgorithmIdentifier { id-ecPublicKey, prime256v1 }`.
const EC_P256_ALGORITHM: &[u8] = &[
    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03,
    0x01, 0x07,
];
/// `AlgorithmIdentifier { id-ecPublicKey, secp384r1 }`.
const EC_P384_ALGORITHM: &[u8] = &[
    0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22,
];

/// Parses the first private key in `pem` (PKCS#8, PKCS#1 RSA or SEC1 EC on P-256/P-384).
pub(crate) fn parse_private_key(pem: &[u8]) -> Result<KeyPair, String> {
    let der = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no PEM private key: {e}"))?;
    let unsupported = |e: rcgen::Error| format!("unsupported private key: {e}");
    match der {
        PrivateKeyDer::Pkcs8(k) => KeyPair::try_from(k.secret_pkcs8_der()).map_err(unsupported),
        PrivateKeyDer::Pkcs1(k) => KeyPair::try_from(pkcs8(RSA_ALGORITHM, k.secret_pkcs1_der())).map_err(unsupported),
        PrivateKeyDer::Sec1(k) => {
            // SEC1 names its curve only optionally; ring rejects a wrapper whose curve does not match.
            KeyPair::try_from(pkcs8(EC_P256_ALGORITHM, k.secret_sec1_der()))
                .or_else(|_| KeyPair::try_from(pkcs8(EC_P384_ALGORITHM, k.secret_sec1_der())))
                .map_err(unsupported)
        }
        _ => Err("unsupported private key format (hint: use PKCS#8, PKCS#1 RSA or SEC1 EC)".into()),
    }
}

/// `PrivateKeyInfo { version 0, algorithm, privateKey }` (RFC 5208).
fn pkcs8(algorithm: &[u8], private_key: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(algorithm);
    body.extend(der_tlv(0x04, private_key));
    der_tlv(0x30, &body)
}

/// One DER tag-length-value with a definite length.
fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

    const RSA_PKCS1: &str = include_str!("../testdata/rsa-pkcs1-ca-key.pem");
    const EC_SEC1: &str = include_str!("../testdata/ec-sec1-ca-key.pem");

    #[test]
    fn der_lengths() {
        assert_eq!(der_tlv(0x04, &[1, 2]), vec![0x04, 2, 1, 2]);
        let long = der_tlv(0x04, &[0; 200]);
        assert_eq!(&long[..3], &[0x04, 0x81, 200]);
        let longer = der_tlv(0x04, &[0; 300]);
        assert_eq!(&longer[..4], &[0x04, 0x82, 0x01, 0x2c]);
        assert_eq!(longer.len(), 304);
    }

    #[test]
    fn pkcs8_round_trip() {
        let k = KeyPair::generate().unwrap();
        let parsed = parse_private_key(k.serialize_pem().as_bytes()).unwrap();
        assert_eq!(parsed.subject_public_key_info(), k.subject_public_key_info());
    }

    #[test]
    fn pkcs1_rsa_from_openssl() {
        let k = parse_private_key(RSA_PKCS1.as_bytes()).unwrap();
        assert_eq!(k.algorithm(), &rcgen::PKCS_RSA_SHA256);
    }

    #[test]
    fn sec1_ec_from_openssl() {
        let k = parse_private_key(EC_SEC1.as_bytes()).unwrap();
        assert_eq!(k.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
    }

    #[test]
    fn sec1_without_curve_parameters() {
        // ring's PKCS#8 holds an ECPrivateKey without the optional curve: a SEC1 key of that shape.
        let k = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let der = k.serialize_der();
        let (_, info, _) = read_tlv(&der);
        let (_, _, rest) = read_tlv(info); // version
        let (_, _, rest) = read_tlv(rest); // algorithm
        let (tag, sec1, _) = read_tlv(rest);
        assert_eq!(tag, 0x04);
        assert!(
            KeyPair::try_from(pkcs8(EC_P256_ALGORITHM, sec1)).is_err(),
            "curve mismatch is rejected"
        );
        let parsed = KeyPair::try_from(pkcs8(EC_P384_ALGORITHM, sec1)).unwrap();
        assert_eq!(parsed.subject_public_key_info(), k.subject_public_key_info());
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_private_key(b"not a key").is_err());
        let cert = include_str!("../testdata/ec-ca-cert.pem");
        assert!(parse_private_key(cert.as_bytes()).is_err());
    }

    /// (tag, content, rest) of the DER value at the start of `b`.
    fn read_tlv(b: &[u8]) -> (u8, &[u8], &[u8]) {
        let (len, header) = match b[1] {
            n if n < 0x80 => (n as usize, 2),
            n => {
                let count = (n & 0x7f) as usize;
                let len = b[2..2 + count].iter().fold(0usize, |acc, x| (acc << 8) | *x as usize);
                (len, 2 + count)
            }
        };
        (b[0], &b[header..header + len], &b[header + len..])
    }
}
