//! A node's tunnel identity: an X25519 key pair made for one run of the net-forwarder, and the
//! pairwise keys it shares with each peer.
//!
//! The public key is published on the node's own Node object (NodeRestriction lets a node patch
//! only its own), so a node can only claim its own identity. For sender S and receiver R the
//! message key is `HKDF-SHA256(ikm = X25519(S, R), salt = "hpk-tunnel-v3", info = S_pub ||
//! R_pub)`: one key per direction and pair, which only S and R can compute. A receiver therefore
//! knows which peer sealed a message that opens, and no node can forge another's messages.
//!
//! The secret lives in memory only (unless `--tunnel-private-key-file` names one, for static
//! set-ups) and is new at every start, so a restarted peer has a new public key: its previous
//! run's datagrams carry a key id no peer table holds, and nothing depends on its clock.

use std::fmt;

use ring::aead::{AES_256_GCM, LessSafeKey, UnboundKey};
use ring::hkdf;
use ring::rand::SecureRandom;
use sha2::{Digest, Sha256};
use x25519_dalek::StaticSecret;

use crate::{Error, Result};

/// Bytes of an X25519 key, public or secret.
pub const KEY_LEN: usize = 32;
/// Bytes of a key id, the sender's name in every message header.
pub const KEY_ID_LEN: usize = 8;
const HKDF_SALT: &[u8] = b"hpk-tunnel-v3";

/// A node's X25519 public key, as published in the Node annotation and the `--peer` flag:
/// 64 lowercase hexadecimal digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; KEY_LEN]);

impl PublicKey {
    /// Parses 64 lowercase hexadecimal digits (nothing around them); refuses the low-order
    /// points, with which every shared secret would be all zeroes.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: &str| Error::InvalidArgument(format!("tunnel public key {text:?}: {why}"));
        if text.len() != KEY_LEN * 2 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("expected 64 lowercase hexadecimal digits"));
        }
        let bytes = hex::decode(text).map_err(|_| bad("expected 64 lowercase hexadecimal digits"))?;
        let key = PublicKey(<[u8; KEY_LEN]>::try_from(bytes).map_err(|_| bad("expected 32 bytes"))?);
        if key.is_low_order() {
            return Err(bad("a low-order point, not a usable X25519 public key"));
        }
        Ok(key)
    }

    /// A key from its bytes (not checked: [`Identity::pair`] refuses a low-order one).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        PublicKey(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// The id messages sealed by this key's owner carry: the first 8 bytes of its SHA-256.
    pub fn key_id(&self) -> KeyId {
        let digest = Sha256::digest(self.0);
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&digest[..KEY_ID_LEN]);
        KeyId(id)
    }

    /// Whether every shared secret with this point is zero. A clamped scalar is a multiple of
    /// the cofactor 8, so its product with a low-order point (of the curve or its twist) is
    /// the identity whatever the scalar: testing one fixed scalar tests them all.
    fn is_low_order(&self) -> bool {
        let probe = StaticSecret::from([0x55; KEY_LEN]);
        !probe.diffie_hellman(&x25519_dalek::PublicKey::from(self.0)).was_contributory()
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// The sender's name in a message header (see [`PublicKey::key_id`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; KEY_ID_LEN]);

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", hex::encode(self.0))
    }
}

/// This run's key pair.
pub struct Identity {
    secret: StaticSecret,
    public: PublicKey,
}

/// The two message keys of a pair of nodes, as one of them holds them.
pub struct PairKeys {
    /// Seals what this node sends to the peer.
    pub seal: LessSafeKey,
    /// Opens what the peer sends to this node.
    pub open: LessSafeKey,
}

impl Identity {
    /// A fresh key pair from the system's random number generator.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; KEY_LEN];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::Config("the system's random number generator failed".into()))?;
        Ok(Self::from_secret(bytes))
    }

    /// The key pair of a secret (as read from a private key file).
    pub fn from_secret(bytes: [u8; KEY_LEN]) -> Self {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey(x25519_dalek::PublicKey::from(&secret).to_bytes());
        Identity { secret, public }
    }

    /// The public key, to publish.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// The secret's bytes, for the private key file only.
    pub(crate) fn secret_bytes(&self) -> [u8; KEY_LEN] {
        self.secret.to_bytes()
    }

    /// The keys shared with `peer`. Refused: a low-order peer key (the shared secret would be
    /// zero, known to anyone) and this node's own key (a peer cannot be this node).
    pub fn pair(&self, peer: &PublicKey) -> Result<PairKeys> {
        if *peer == self.public {
            return Err(Error::InvalidArgument(format!("tunnel public key {peer} is this node's own")));
        }
        let shared = self.secret.diffie_hellman(&x25519_dalek::PublicKey::from(peer.0));
        if !shared.was_contributory() {
            return Err(Error::InvalidArgument(format!(
                "tunnel public key {peer}: a low-order point, not a usable X25519 public key"
            )));
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, HKDF_SALT).extract(shared.as_bytes());
        let key = |from: &PublicKey, to: &PublicKey| {
            let info = [&from.0[..], &to.0[..]];
            // Only fails for lengths beyond 255 blocks; 32 bytes is one.
            let okm = prk.expand(&info, &AES_256_GCM).expect("HKDF output of one block");
            LessSafeKey::new(UnboundKey::from(okm))
        };
        Ok(PairKeys { seal: key(&self.public, peer), open: key(peer, &self.public) })
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({}, secret ..)", self.public)
    }
}
