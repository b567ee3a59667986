//! Per-node tokens (review H3): a node's token is HMAC-SHA256 of its name under the cluster's
//! node-token key, in hexadecimal.
//!
//! Only the controller (its cert-signer) and the launchers hold the key; each bubble holds the
//! token of its own node only. The signer recomputes the token for the node a request names,
//! so a leaked token obtains certificates for its own node's name and for no other.

use ring::hmac;

/// Length of a token and of a key, in hexadecimal digits (32 bytes).
pub const HEX_LEN: usize = 64;

/// What is authenticated: a version, so that a token cannot be reused for anything else.
const CONTEXT: &[u8] = b"hpk node token v1\0";

/// The token of node `node` under the cluster's `key`.
pub fn derive(key: &[u8], node: &str) -> String {
    hex::encode(tag(key, node).as_ref())
}

/// Whether `presented` is the token of `node` under `key`, compared in constant time.
pub fn matches(key: &[u8], node: &str, presented: &[u8]) -> bool {
    if presented.len() != HEX_LEN {
        return false;
    }
    let Ok(bytes) = hex::decode(presented) else { return false };
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::verify(&key, &message(node), &bytes).is_ok()
}

/// Whether `text` has a token's form: [`HEX_LEN`] hexadecimal digits.
pub fn well_formed(text: &[u8]) -> bool {
    text.len() == HEX_LEN && text.iter().all(u8::is_ascii_hexdigit)
}

fn tag(key: &[u8], node: &str) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), &message(node))
}

fn message(node: &str) -> Vec<u8> {
    [CONTEXT, node.as_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_one_node_under_one_key() {
        let key = b"0123456789abcdef0123456789abcdef";
        let t1 = derive(key, "n1");
        assert!(well_formed(t1.as_bytes()), "{t1}");
        assert!(matches(key, "n1", t1.as_bytes()));
        assert!(matches(key, "n1", t1.to_uppercase().as_bytes()), "hexadecimal in either case");
        assert!(!matches(key, "n2", t1.as_bytes()), "another node's name");
        assert!(!matches(key, "n1", derive(b"another cluster's key 0123456789", "n1").as_bytes()));
        assert!(!matches(key, "n1", &t1.as_bytes()[..HEX_LEN - 2]), "short");
        assert!(!matches(key, "n1", format!("{t1}00").as_bytes()), "long");
        assert!(!matches(key, "n1", "z".repeat(HEX_LEN).as_bytes()), "not hexadecimal");
        // The name is taken whole: no prefix or suffix of it names the same node.
        assert_ne!(derive(key, "n1"), derive(key, "n10"));
        assert_ne!(derive(key, ""), derive(key, "\0"));
        // HMAC-SHA256 as RFC 2104 defines it (value from Python's hmac module), so any tool
        // can make a node's token.
        assert_eq!(t1, "8579675972367f1f81a819403ecaf832fda69cb9ca24c508e63bc3f933c77051");
        assert!(!well_formed(b"0123"));
    }
}
