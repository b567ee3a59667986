use super::*;
use crate::tunnel::identity::{Identity, PairKeys, PublicKey};

fn pair(a: u8, b: u8) -> (Identity, Identity) {
    (Identity::from_secret([a; 32]), Identity::from_secret([b; 32]))
}

/// `from`'s keys with `to`.
fn keys(from: &Identity, to: &Identity) -> PairKeys {
    from.pair(&to.public()).unwrap()
}

fn seal(sealer: &mut Sealer, key: &LessSafeKey, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0; HEADER_LEN + payload.len() + TAG_LEN];
    buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    let n = sealer.seal(key, &mut buf, payload.len()).unwrap().len;
    buf.truncate(n);
    buf
}

fn open_with(key: &LessSafeKey, d: &mut [u8]) -> std::result::Result<std::ops::Range<usize>, Refused> {
    let header = Header::parse(d)?;
    open(key, header, d)
}

#[test]
fn a_message_sealed_for_r_opens_only_at_r_with_s_key() {
    let (s, r) = pair(1, 2);
    let other = Identity::from_secret([3; 32]);
    let mut sealer = Sealer::new(s.public().key_id(), 0);
    let payload = vec![7u8; 1400];
    let d = seal(&mut sealer, &keys(&s, &r).seal, &payload);
    assert_eq!(d.len(), payload.len() + OVERHEAD);
    assert_ne!(&d[HEADER_LEN..HEADER_LEN + 1400], &payload[..], "the payload travels encrypted");
    assert_eq!(Header::parse(&d).unwrap(), Header { id: s.public().key_id(), counter: 1 });
    // R opens it with the key it shares with S.
    let mut at_r = d.clone();
    let range = open_with(&keys(&r, &s).open, &mut at_r).unwrap();
    assert_eq!(&at_r[range], &payload[..]);
    // Nobody else can: not a third node with S's public key, not R with another sender's key,
    // not S itself (the keys are directional: S→R is not R→S).
    for key in [&keys(&other, &s).open, &keys(&r, &other).open, &keys(&s, &r).open, &keys(&r, &s).seal] {
        assert_eq!(open_with(key, &mut d.clone()), Err(Refused::Auth));
    }
}

#[test]
fn forged_and_corrupted_messages_fail_authentication() {
    let (s, r) = pair(1, 2);
    let mut sealer = Sealer::new(s.public().key_id(), 0);
    let good = seal(&mut sealer, &keys(&s, &r).seal, b"hello pod");
    let open_key = keys(&r, &s).open;
    for i in 0..good.len() {
        let mut d = good.clone();
        d[i] ^= 0x01;
        let r = open_with(&open_key, &mut d);
        assert!(matches!(r, Err(Refused::Auth | Refused::Malformed)), "flipped byte {i}: {r:?}");
    }
    assert!(open_with(&open_key, &mut good.clone()).is_ok());
}

#[test]
fn garbage_and_older_versions_are_malformed() {
    for d in [vec![], vec![0; 10], vec![0xff; 100], b"HK\x03\x02".repeat(20), b"HK\x03\x09".repeat(20)] {
        assert_eq!(Header::parse(&d), Err(Refused::Malformed));
    }
    let (s, r) = pair(1, 2);
    let mut v2 = seal(&mut Sealer::new(s.public().key_id(), 0), &keys(&s, &r).seal, b"old");
    v2[2] = 2;
    assert_eq!(Header::parse(&v2), Err(Refused::Malformed), "version 2 (the cluster key) is gone");
}

#[test]
fn one_counter_is_shared_by_all_peers() {
    let (s, r1) = pair(1, 2);
    let r2 = Identity::from_secret([3; 32]);
    let (k1, k2) = (keys(&s, &r1), keys(&s, &r2));
    let mut sealer = Sealer::new(s.public().key_id(), 0);
    let mut seen = std::collections::HashSet::new();
    for i in 0..100 {
        let key = if i % 3 == 0 { &k2.seal } else { &k1.seal };
        let d = seal(&mut sealer, key, b"x");
        assert!(seen.insert(Header::parse(&d).unwrap().counter), "a counter was used twice");
    }
    assert_eq!(sealer.counter(), 100);
}

#[test]
fn the_window_refuses_replays_and_tolerates_reordering() {
    let mut w = Window::default();
    assert_eq!(w.check(0), Err(Refused::Replay), "counters start at 1");
    w.accept(5).unwrap();
    w.accept(3).unwrap();
    assert_eq!(w.check(5), Err(Refused::Replay));
    assert_eq!(w.check(3), Err(Refused::Replay));
    assert!(w.check(4).is_ok(), "checking records nothing");
    assert!(w.check(4).is_ok());
    w.accept(6000).unwrap();
    assert_eq!(w.check(4), Err(Refused::Replay), "fell out of the window");
    w.accept(6000 - WINDOW + 1).unwrap();
    assert_eq!(w.check(6000 - WINDOW), Err(Refused::Replay), "just below the window");
    // Gaps of every size (a shared counter skips the values sent to other peers).
    let mut w = Window::default();
    let mut c = 1;
    let mut accepted = Vec::new();
    for gap in (1..300).chain([4095, 4096, 4097, 10_000]) {
        c += gap;
        w.accept(c).unwrap();
        accepted.push(c);
    }
    for &old in accepted.iter().rev().take_while(|&&old| old + WINDOW > c) {
        assert_eq!(w.check(old), Err(Refused::Replay), "{old} replayed");
    }
    for fresh in [c - 1, c - 2, c - WINDOW + 1] {
        assert!(w.check(fresh).is_ok(), "{fresh} never seen");
    }
}

#[test]
fn low_order_and_own_keys_are_refused() {
    let me = Identity::from_secret([1; 32]);
    let mut order8 = [0u8; 32];
    hex::decode_to_slice("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800", &mut order8)
        .unwrap();
    for low in [
        [0u8; 32],
        {
            let mut one = [0u8; 32];
            one[0] = 1;
            one
        },
        order8,
    ] {
        let e = me.pair(&PublicKey::from_bytes(low)).err().expect("refused").to_string();
        assert!(e.contains("low-order"), "{e}");
        assert!(PublicKey::parse(&hex::encode(low)).unwrap_err().to_string().contains("low-order"));
    }
    let e = me.pair(&me.public()).err().expect("refused").to_string();
    assert!(e.contains("this node's own"), "{e}");
}

#[test]
fn public_keys_are_64_lowercase_hex_digits() {
    let k = Identity::from_secret([9; 32]).public();
    assert_eq!(PublicKey::parse(&k.to_string()).unwrap(), k);
    let text = k.to_string();
    for bad in
        [String::new(), text.to_uppercase(), format!("{text}\n"), text[1..].to_owned(), format!("{text}ab")]
    {
        let e = PublicKey::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("64 lowercase hexadecimal digits"), "{bad:?}: {e}");
    }
    assert_eq!(k.key_id(), PublicKey::parse(&text).unwrap().key_id());
    assert_ne!(k.key_id(), Identity::from_secret([8; 32]).public().key_id());
    assert!(format!("{:?}", Identity::from_secret([9; 32])).contains("secret .."), "never printed");
}

#[test]
fn threads_sealing_at_once_never_share_a_counter() {
    let (s, r) = pair(1, 2);
    let key = keys(&s, &r);
    let sealer = Sealer::new(s.public().key_id(), 1000);
    let counters: Vec<u64> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    (0..500)
                        .map(|_| {
                            let mut buf = vec![0; HEADER_LEN + 8 + TAG_LEN];
                            let sealed = sealer.seal(&key.seal, &mut buf, 8).unwrap();
                            assert_eq!(Header::parse(&buf).unwrap().counter, sealed.counter);
                            sealed.counter
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let unique: std::collections::HashSet<u64> = counters.iter().copied().collect();
    assert_eq!(unique.len(), 2000, "a counter (a nonce) was used twice");
    assert_eq!((unique.iter().min(), unique.iter().max()), (Some(&1001), Some(&3000)));
    assert_eq!(sealer.counter(), 3000);
}
